/* One rank of a C program against the CUDA toolkit's nccl.h, linked to railyard's libnccl.so.2,
 * on host memory: what a C user does first (version, unique id passed through a file, init,
 * AllReduce, a send/recv ring in a group, error strings, destroy). nccl_api_test.py runs 4 of
 * them on 2 daemons. Environment as nccl_ranks.cc. Exit code: failures. */
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures = 0;
static int rank = 0;

#define CHECK(cond, ...)                                     \
  do {                                                       \
    if (!(cond)) {                                           \
      ++failures;                                            \
      fprintf(stderr, "rank %d FAIL line %d: ", rank, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                          \
      fprintf(stderr, "\n");                                 \
    }                                                        \
  } while (0)

#define NCCL(call)                                                                      \
  do {                                                                                  \
    ncclResult_t r_ = (call);                                                           \
    if (r_ != ncclSuccess) {                                                            \
      fprintf(stderr, "rank %d FATAL %s: %s (%s)\n", rank, #call, ncclGetErrorString(r_), \
              ncclGetLastError(NULL));                                                  \
      exit(100);                                                                        \
    }                                                                                   \
  } while (0)

int main(void) {
  const char* r = getenv("NCCL_TEST_RANK");
  const char* n = getenv("NCCL_TEST_NRANKS");
  const char* dir = getenv("NCCL_TEST_DIR");
  rank = r ? atoi(r) : 0;
  const int nranks = n ? atoi(n) : 1;
  char path[4096], tmp[4200];
  snprintf(path, sizeof(path), "%s/c-world", dir ? dir : ".");
  snprintf(tmp, sizeof(tmp), "%s.tmp", path);

  int version = 0;
  NCCL(ncclGetVersion(&version));
  CHECK(version == NCCL_VERSION_CODE, "version %d, header %d", version, NCCL_VERSION_CODE);

  ncclUniqueId id;
  if (rank == 0) {
    NCCL(ncclGetUniqueId(&id));
    FILE* f = fopen(tmp, "wb");
    fwrite(&id, sizeof(id), 1, f);
    fclose(f);
    rename(tmp, path);
  } else {
    int got = 0;
    for (int i = 0; i < 3000 && !got; ++i) {
      FILE* f = fopen(path, "rb");
      if (f) {
        got = fread(&id, sizeof(id), 1, f) == 1;
        fclose(f);
      }
      if (!got) usleep(10000);
    }
    if (!got) {
      fprintf(stderr, "rank %d FATAL: no unique id\n", rank);
      return 101;
    }
  }
  ncclComm_t comm;
  NCCL(ncclCommInitRank(&comm, nranks, id, rank));
  int count = 0, me = -1;
  NCCL(ncclCommCount(comm, &count));
  NCCL(ncclCommUserRank(comm, &me));
  CHECK(count == nranks && me == rank, "count %d rank %d", count, me);

  enum { N = 1 << 16 };
  float* a = malloc(N * sizeof(float));
  for (int i = 0; i < N; ++i) a[i] = (float)(rank + i % 3);
  NCCL(ncclAllReduce(a, a, N, ncclFloat, ncclSum, comm, NULL));
  int bad = 0;
  for (int i = 0; i < N; ++i) bad += a[i] != (float)(nranks * (nranks - 1) / 2 + nranks * (i % 3));
  CHECK(bad == 0, "AllReduce: %d wrong", bad);

  long long out[100], in[100];
  for (int i = 0; i < 100; ++i) out[i] = rank * 1000 + i;
  NCCL(ncclGroupStart());
  NCCL(ncclSend(out, 100, ncclInt64, (rank + 1) % nranks, comm, NULL));
  NCCL(ncclRecv(in, 100, ncclInt64, (rank + nranks - 1) % nranks, comm, NULL));
  NCCL(ncclGroupEnd());
  bad = 0;
  for (int i = 0; i < 100; ++i) bad += in[i] != ((rank + nranks - 1) % nranks) * 1000 + i;
  CHECK(bad == 0, "ring: %d wrong", bad);

  ncclResult_t e = ncclAllReduce(a, a, N, ncclFloat, (ncclRedOp_t)99, comm, NULL);
  CHECK(e == ncclInvalidArgument && strlen(ncclGetLastError(comm)) > 0, "bad op: %d '%s'", e,
        ncclGetLastError(comm));
  CHECK(strcmp(ncclGetErrorString(ncclRemoteError),
               "remote process exited or there was a network error") == 0,
        "error string");

  NCCL(ncclCommDestroy(comm));
  free(a);
  printf("rank %d: C program %s\n", rank, failures ? "FAILED" : "OK");
  return failures > 99 ? 99 : failures;
}
