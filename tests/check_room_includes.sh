#!/usr/bin/env bash
# Every #include "moetron/<room>/..." in src/moetron/<from>/ names <from> itself or a room that
# <from> may depend on, as the MOETRON_ROOM_DEPENDS_<from> lines of CMakeLists.txt declare them.
# The build enforces the same for what it compiles; this also covers headers no source includes.
# Usage: check_room_includes.sh SOURCE_DIR
set -euo pipefail
source_dir=${1:?usage: check_room_includes.sh SOURCE_DIR}
status=0
rooms=0
while read -r room allowed; do
    rooms=$((rooms + 1))
    [[ -d "$source_dir/src/moetron/$room" ]] || { echo "no room folder src/moetron/$room"; exit 1; }
    while IFS=: read -r file line text; do
        target=$(sed -E 's/.*"moetron\/([a-z_]+)\/.*/\1/' <<<"$text")
        if [[ " $room $allowed " != *" $target "* ]]; then
            echo "${file#"$source_dir"/}:$line: $room may not include $target (allowed: ${allowed:-nothing}): $text"
            status=1
        fi
    done < <(grep -rnE '^\s*#\s*include\s+"moetron/' "$source_dir/src/moetron/$room" \
                 --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' || true)
done < <(sed -nE 's/^set\(MOETRON_ROOM_DEPENDS_([a-z_]+) ?([a-z_ ]*)\)$/\1 \2/p' \
             "$source_dir/CMakeLists.txt")
if ((rooms == 0)); then
    echo "no MOETRON_ROOM_DEPENDS_<room> lines found in $source_dir/CMakeLists.txt"
    exit 1
fi
exit $status
