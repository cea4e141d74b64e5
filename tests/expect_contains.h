// Expectations on text (a command's output, an error message): the haystack is printed when
// one fails.
#pragma once

#include <gtest/gtest.h>

#include <string>

#define EXPECT_CONTAINS(haystack, needle) \
    EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)
#define EXPECT_NOT_CONTAINS(haystack, needle) \
    EXPECT_EQ(std::string(haystack).find(needle), std::string::npos) << (haystack)
