// mtb_probe: checks a test-bed job. It prints which emulated host every rank runs on and
// checks that consecutive blocks of --ranks-per-node ranks share a host; then it measures the
// point-to-point bandwidth and latency of one rank pair inside a node (shared memory), one
// pair across nodes (the shaped TCP link) and all node-0 -> node-1 pairs at once (the whole
// link), and every rank at once inside the nodes. Each figure is the best of --repeats runs:
// the machine is shared, and the least disturbed run is the one that shows the bed's paths.
// With --link-rate-bytes-per-s it also checks that the shaping holds (the aggregate
// across nodes stays near the link rate) and that the path inside a node is the fast one.
//
// Built at run time by tools/testbed/testbed.sh (mpicc -O2); exit status 0 = all checks pass.
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { kHostChars = 64, kWindow = 8, kTagData = 1, kTagAck = 2, kLatencyIters = 200 };

typedef struct {
    int ranks_per_node;
    long bytes_per_message;
    long num_messages;
    int repeats;                   // each figure is the best of this many runs
    double link_rate_bytes_per_s;  // 0: report only, no bandwidth verdict
} Options;

static void usage_and_exit(int rank) {
    if (rank == 0) {
        fprintf(stderr,
                "usage: mtb_probe --ranks-per-node N [--message-bytes B] [--messages K]\n"
                "                 [--repeats N] [--link-rate-bytes-per-s R]\n");
    }
    MPI_Finalize();
    exit(2);
}

static Options parse_options(int argc, char** argv, int rank) {
    Options o = {0, 1 << 20, 64, 3, 0.0};
    for (int i = 1; i < argc; ++i) {
        if (i + 1 >= argc) usage_and_exit(rank);
        const char* value = argv[++i];
        if (strcmp(argv[i - 1], "--ranks-per-node") == 0) {
            o.ranks_per_node = atoi(value);
        } else if (strcmp(argv[i - 1], "--message-bytes") == 0) {
            o.bytes_per_message = atol(value);
        } else if (strcmp(argv[i - 1], "--messages") == 0) {
            o.num_messages = atol(value);
        } else if (strcmp(argv[i - 1], "--repeats") == 0) {
            o.repeats = atoi(value);
        } else if (strcmp(argv[i - 1], "--link-rate-bytes-per-s") == 0) {
            o.link_rate_bytes_per_s = atof(value);
        } else {
            usage_and_exit(rank);
        }
    }
    if (o.ranks_per_node < 1 || o.bytes_per_message < 1 || o.num_messages < 1 || o.repeats < 1) {
        usage_and_exit(rank);
    }
    return o;
}

// A barrier that sleeps between polls: with more ranks than cores, ranks that only wait must
// not steal the CPU from the pair being measured (Open MPI's own waits spin).
static void quiet_barrier(void) {
    MPI_Request request;
    MPI_Ibarrier(MPI_COMM_WORLD, &request);
    int done = 0;
    const struct timespec nap = {0, 200 * 1000};
    for (;;) {
        MPI_Test(&request, &done, MPI_STATUS_IGNORE);
        if (done) return;
        nanosleep(&nap, NULL);
    }
}

// Streams num_messages messages of bytes_per_message from `sender` to `receiver` (at most
// kWindow in flight), then one ack back; returns the sender's elapsed seconds (0 elsewhere).
static double stream(int rank, int sender, int receiver, char* buffer, const Options* o) {
    MPI_Request requests[kWindow];
    double start = MPI_Wtime();
    if (rank == sender || rank == receiver) {
        for (long sent = 0; sent < o->num_messages; sent += kWindow) {
            int batch = (int)(o->num_messages - sent < kWindow ? o->num_messages - sent : kWindow);
            for (int w = 0; w < batch; ++w) {
                char* slot = buffer + (size_t)w * (size_t)o->bytes_per_message;
                if (rank == sender) {
                    MPI_Isend(slot, (int)o->bytes_per_message, MPI_CHAR, receiver, kTagData,
                              MPI_COMM_WORLD, &requests[w]);
                } else {
                    MPI_Irecv(slot, (int)o->bytes_per_message, MPI_CHAR, sender, kTagData,
                              MPI_COMM_WORLD, &requests[w]);
                }
            }
            MPI_Waitall(batch, requests, MPI_STATUSES_IGNORE);
        }
        char ack = 0;
        if (rank == sender) {
            MPI_Recv(&ack, 1, MPI_CHAR, receiver, kTagAck, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Send(&ack, 1, MPI_CHAR, sender, kTagAck, MPI_COMM_WORLD);
        }
    }
    return rank == sender ? MPI_Wtime() - start : 0.0;
}

// Half the round-trip time of an 8-byte ping-pong between a and b, in microseconds.
static double half_round_trip_us(int rank, int a, int b) {
    char message[8] = {0};
    double start = MPI_Wtime();
    for (int i = 0; i < kLatencyIters && (rank == a || rank == b); ++i) {
        if (rank == a) {
            MPI_Send(message, 8, MPI_CHAR, b, kTagData, MPI_COMM_WORLD);
            MPI_Recv(message, 8, MPI_CHAR, b, kTagData, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(message, 8, MPI_CHAR, a, kTagData, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(message, 8, MPI_CHAR, a, kTagData, MPI_COMM_WORLD);
        }
    }
    return (MPI_Wtime() - start) / kLatencyIters / 2.0 * 1e6;
}

// Smallest of each rank's `seconds` over repetitions, then slowest over ranks: the time of one
// all-ranks measurement, taken from its least disturbed repetition. On rank 0 only.
static double slowest_rank_seconds(double seconds) {
    double slowest = 0.0;
    MPI_Reduce(&seconds, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    return slowest;
}

// One pair, measured alone (every other rank waits in a quiet barrier). Returns bytes/s on
// rank 0, which prints the line.
static double measure_pair(int rank, int a, int b, const char* what, char* buffer,
                           const Options* o) {
    quiet_barrier();
    stream(rank, a, b, buffer, o);     // warm-up: connections, registration, first-touch
    double results[2] = {1e30, 1e30};  // best seconds, best half round trip (us), on rank a
    for (int rep = 0; rep < o->repeats; ++rep) {
        quiet_barrier();
        double seconds = stream(rank, a, b, buffer, o);
        quiet_barrier();
        double latency_us = half_round_trip_us(rank, a, b);
        if (seconds < results[0]) results[0] = seconds;
        if (latency_us < results[1]) results[1] = latency_us;
    }
    if (a != 0 && rank == a) MPI_Send(results, 2, MPI_DOUBLE, 0, kTagAck, MPI_COMM_WORLD);
    if (a != 0 && rank == 0) {
        MPI_Recv(results, 2, MPI_DOUBLE, a, kTagAck, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    double bytes_per_s = (double)o->bytes_per_message * (double)o->num_messages / results[0];
    if (rank == 0) {
        printf("%-26s rank %d -> rank %d: %9.1f MB/s, half round trip %7.1f us\n", what, a, b,
               bytes_per_s / 1e6, results[1]);
    }
    quiet_barrier();
    return bytes_per_s;
}

// Every rank at once, inside its node: local rank i sends to local rank i+1 and receives from
// local rank i-1 (a ring per node, all nodes at the same time): the shared-memory bandwidth one
// rank gets while its node's other ranks and the machine's other nodes are busy too.
static double measure_intra_all(int rank, char* buffer, const Options* o) {
    int rpn = o->ranks_per_node;
    int base = rank / rpn * rpn;
    int next = base + (rank - base + 1) % rpn;
    int prev = base + (rank - base + rpn - 1) % rpn;
    char* inbox = buffer + (size_t)(kWindow / 2) * (size_t)o->bytes_per_message;
    double best = 1e30;
    for (int round = 0; round <= o->repeats; ++round) {  // round 0 warms up
        quiet_barrier();
        double start = MPI_Wtime();
        for (long done = 0; done < o->num_messages; done += kWindow / 2) {
            MPI_Request requests[kWindow];
            int batch =
                (int)(o->num_messages - done < kWindow / 2 ? o->num_messages - done : kWindow / 2);
            for (int w = 0; w < batch; ++w) {
                size_t offset = (size_t)w * (size_t)o->bytes_per_message;
                MPI_Irecv(inbox + offset, (int)o->bytes_per_message, MPI_CHAR, prev, kTagData,
                          MPI_COMM_WORLD, &requests[2 * w]);
                MPI_Isend(buffer + offset, (int)o->bytes_per_message, MPI_CHAR, next, kTagData,
                          MPI_COMM_WORLD, &requests[2 * w + 1]);
            }
            MPI_Waitall(2 * batch, requests, MPI_STATUSES_IGNORE);
        }
        double slowest = slowest_rank_seconds(MPI_Wtime() - start);
        if (round > 0 && slowest < best) best = slowest;
    }
    double bytes_per_s = (double)o->bytes_per_message * (double)o->num_messages / best;
    if (rank == 0) {
        printf("%-26s ring in every node at once: %9.1f MB/s per rank\n", "intra-node, all ranks",
               bytes_per_s / 1e6);
    }
    quiet_barrier();
    return bytes_per_s;
}

// Every rank of node 0 streams to the rank with the same local index on node 1, all at once.
static double measure_link(int rank, char* buffer, const Options* o) {
    int rpn = o->ranks_per_node;
    int sender = rank < rpn ? rank : rank - rpn;
    int receiver = sender + rpn;
    if (rank >= 2 * rpn) sender = receiver = -1;  // ranks beyond node 1 take no part
    double best = 1e30;
    for (int round = 0; round <= o->repeats; ++round) {  // round 0 warms up
        quiet_barrier();
        double start = MPI_Wtime();
        stream(rank, sender, receiver, buffer, o);
        double slowest = slowest_rank_seconds(MPI_Wtime() - start);
        if (round > 0 && slowest < best) best = slowest;
    }
    double bytes = (double)rpn * (double)o->bytes_per_message * (double)o->num_messages;
    double bytes_per_s = rank == 0 ? bytes / best : 0.0;
    if (rank == 0) {
        printf("%-26s %d pairs node0 -> node1: %9.1f MB/s in all, %.1f MB/s per rank\n",
               "inter-node link", rpn, bytes_per_s / 1e6, bytes_per_s / 1e6 / rpn);
    }
    quiet_barrier();
    return bytes_per_s;
}

// Checks that blocks of ranks_per_node consecutive ranks share one host and that different
// blocks are on different hosts; rank 0 prints the placement. Returns the number of errors.
static int check_placement(int rank, int world, const Options* o) {
    char host[kHostChars] = {0};
    gethostname(host, kHostChars - 1);
    char* hosts = rank == 0 ? calloc((size_t)world, kHostChars) : NULL;
    MPI_Gather(host, kHostChars, MPI_CHAR, hosts, kHostChars, MPI_CHAR, 0, MPI_COMM_WORLD);
    int errors = 0;
    if (rank == 0) {
        for (int r = 0; r < world; ++r) {
            const char* mine = hosts + (size_t)r * kHostChars;
            const char* first_of_block =
                hosts + (size_t)(r / o->ranks_per_node * o->ranks_per_node) * kHostChars;
            int ok = strcmp(mine, first_of_block) == 0;
            for (int q = 0; q < r / o->ranks_per_node * o->ranks_per_node && ok; ++q) {
                ok = strcmp(mine, hosts + (size_t)q * kHostChars) != 0;
            }
            printf("rank %d on host %s%s\n", r, mine, ok ? "" : "   <-- wrong host");
            errors += !ok;
        }
        free(hosts);
    }
    MPI_Bcast(&errors, 1, MPI_INT, 0, MPI_COMM_WORLD);
    return errors;
}

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    int rank = 0, world = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    setvbuf(stdout, NULL, _IOLBF, 0);
    Options o = parse_options(argc, argv, rank);
    if (world % o.ranks_per_node != 0 || world < 2 * o.ranks_per_node || o.ranks_per_node < 2) {
        if (rank == 0) {
            fprintf(stderr,
                    "mtb_probe: needs at least 2 nodes of at least 2 ranks, got %d "
                    "ranks with --ranks-per-node %d\n",
                    world, o.ranks_per_node);
        }
        MPI_Finalize();
        return 2;
    }
    int failures = check_placement(rank, world, &o);

    char* buffer = malloc((size_t)kWindow * (size_t)o.bytes_per_message);
    memset(buffer, 1, (size_t)kWindow * (size_t)o.bytes_per_message);
    int rpn = o.ranks_per_node;
    double intra = measure_pair(rank, 0, 1, "intra-node (shared memory)", buffer, &o);
    double inter = measure_pair(rank, 0, rpn, "inter-node (TCP link)", buffer, &o);
    double link = measure_link(rank, buffer, &o);
    measure_intra_all(rank, buffer, &o);
    free(buffer);

    if (rank == 0 && o.link_rate_bytes_per_s > 0) {
        // Loose bounds: the point is which path carries the bytes, not an exact figure.
        int shaped = link <= 1.15 * o.link_rate_bytes_per_s;
        int fast_inside = intra > 2.0 * inter;
        printf("check: inter-node link %.1f MB/s <= 1.15 x shaped rate %.1f MB/s: %s\n", link / 1e6,
               o.link_rate_bytes_per_s / 1e6, shaped ? "ok" : "FAILED");
        printf("check: intra-node pair %.1f MB/s > 2 x inter-node pair %.1f MB/s: %s\n",
               intra / 1e6, inter / 1e6, fast_inside ? "ok" : "FAILED");
        failures += !shaped + !fast_inside;
    }
    MPI_Bcast(&failures, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("mtb_probe: %s\n", failures == 0 ? "all checks passed" : "FAILED");
    MPI_Finalize();
    return failures == 0 ? 0 : 1;
}
