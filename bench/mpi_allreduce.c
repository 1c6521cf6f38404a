/* nccl-tests-style MPI_Allreduce sweep (float sum), the peer railyard-perf is compared with.
 * Built with each MPI's mpicc by bench/compare_allreduce.sh; prints "size time_us algbw busbw".
 * Buffers are allocated once for the largest size, like railyard-perf's. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t parse_size(const char* s) {
  char* end;
  double v = strtod(s, &end);
  switch (*end) {
    case 'K': case 'k': v *= 1024; break;
    case 'M': case 'm': v *= 1024 * 1024; break;
    case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
  }
  return (size_t)v;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  size_t minb = argc > 1 ? parse_size(argv[1]) : 8;
  size_t maxb = argc > 2 ? parse_size(argv[2]) : 64 << 20;
  int factor = argc > 3 ? atoi(argv[3]) : 4;
  int iters = argc > 4 ? atoi(argv[4]) : 20;
  int warmup = argc > 5 ? atoi(argv[5]) : 5;
  float* send = malloc(maxb);
  float* recv = malloc(maxb);
  for (size_t i = 0; i < maxb / sizeof(float); ++i) send[i] = (float)((rank + i) % 7);
  if (rank == 0) printf("# size time_us algbw_GBps busbw_GBps (MPI_Allreduce float sum, %d ranks)\n", n);
  for (size_t bytes = minb; bytes <= maxb; bytes *= factor) {
    int count = (int)(bytes / sizeof(float));
    for (int i = 0; i < warmup; ++i) MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; ++i) MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double t = (MPI_Wtime() - t0) / iters;
    double tmax;
    MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) {
      double algbw = (double)bytes / tmax / 1e9;
      printf("%zu %.2f %.3f %.3f\n", bytes, tmax * 1e6, algbw, algbw * 2.0 * (n - 1) / n);
      fflush(stdout);
    }
  }
  free(send);
  free(recv);
  MPI_Finalize();
  return 0;
}
