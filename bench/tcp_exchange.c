// tcp_exchange: what the kernel's TCP costs for the traffic of a two-node AllReduce on this host,
// and how that cost depends on the bytes a sender keeps in flight.
//
//   tcp_exchange [-n ITERS] [-w WINDOW] SIZE...   (sizes: bytes, or a K or M suffix)
//
// Forks a second process; the two connect over loopback TCP (TCP_NODELAY) and, for each size,
// exchange SIZE bytes each way ITERS times (-n, default 100, after ITERS/10 of warm-up): each
// side sends its buffer and receives the peer's at once (poll, non-blocking send/recv straight
// from and into the two buffers), and the next exchange starts when both of its own transfers are
// done. That is the traffic any AllReduce between two nodes must move (each sends and receives
// SIZE), with no user-space copy, no reduction and no protocol.
//   -w WINDOW  never sends more than WINDOW bytes ahead of what it has received from the peer
//              (a credit window, as a pipelined schedule has); default: no limit.
// Prints per size the median exchange time and the CPU both processes spent per exchange (user +
// system of the timed exchanges):
//
//   tcp-exchange SIZE B each way: median T us, C us CPU per exchange (both processes)
//
// and checks that each size's last exchange delivered the peer's bytes. Every wait is bounded
// (10 s); any failure exits non-zero. docs/data-plane.md ("The kernel's TCP on loopback") has
// what it measured.
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void die(const char* what) {
  fprintf(stderr, "tcp_exchange: %s: %s\n", what, errno ? strerror(errno) : "failed");
  exit(1);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double cpu_s(int who) {
  struct rusage u;
  getrusage(who, &u);
  return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

static size_t parse_size(const char* text) {
  char* end = NULL;
  errno = 0;
  unsigned long long v = strtoull(text, &end, 10);
  if (errno || end == text) {
    fprintf(stderr, "tcp_exchange: bad size '%s'\n", text);
    exit(2);
  }
  if (*end == 'K' || *end == 'k') {
    v <<= 10;
    ++end;
  } else if (*end == 'M' || *end == 'm') {
    v <<= 20;
    ++end;
  }
  if (*end != '\0' || v == 0 || v > (1ull << 32)) {
    fprintf(stderr, "tcp_exchange: bad size '%s' (1 B to 4 GiB, K or M suffix)\n", text);
    exit(2);
  }
  return (size_t)v;
}

// One exchange: send n bytes of s and receive n into r at once, at most window bytes ahead.
static void exchange(int fd, const char* s, char* r, size_t n, size_t window) {
  size_t sent = 0, got = 0;
  while (sent < n || got < n) {
    const size_t limit = window < n - got ? got + window : n;  // no overflow: window may be ~0
    const int may_send = sent < limit;
    struct pollfd p = {fd, (short)((may_send ? POLLOUT : 0) | (got < n ? POLLIN : 0)), 0};
    int k = poll(&p, 1, 10000);
    if (k == 0) {
      errno = ETIMEDOUT;
      die("exchange (10 s without progress)");
    }
    if (k < 0) {
      if (errno == EINTR) continue;
      die("poll");
    }
    if (p.revents & (POLLERR | POLLNVAL)) die("socket error");
    if (may_send && (p.revents & POLLOUT)) {
      ssize_t m = send(fd, s + sent, limit - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (m < 0 && errno != EAGAIN && errno != EINTR) die("send");
      if (m > 0) sent += (size_t)m;
    }
    if (got < n && (p.revents & (POLLIN | POLLHUP))) {
      ssize_t m = recv(fd, r + got, n - got, MSG_DONTWAIT);
      if (m == 0) {
        errno = ECONNRESET;
        die("peer closed");
      }
      if (m < 0 && errno != EAGAIN && errno != EINTR) die("recv");
      if (m > 0) got += (size_t)m;
    }
  }
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  int first = 1, iters = 100;
  size_t window = (size_t)-1;
  for (; first + 1 < argc && argv[first][0] == '-'; first += 2) {
    if (strcmp(argv[first], "-n") == 0) {
      iters = atoi(argv[first + 1]);
    } else if (strcmp(argv[first], "-w") == 0) {
      window = parse_size(argv[first + 1]);
    } else {
      break;
    }
  }
  if (argc <= first || argv[first][0] == '-' || iters < 1 || iters > 1000000) {
    fprintf(stderr, "usage: tcp_exchange [-n ITERS 1..1000000] [-w WINDOW] SIZE...\n");
    return 2;
  }
  size_t nsizes = (size_t)(argc - first), max = 0;
  size_t* sizes = calloc(nsizes, sizeof *sizes);
  if (!sizes) die("calloc");
  for (size_t i = 0; i < nsizes; ++i) {
    sizes[i] = parse_size(argv[first + (int)i]);
    if (sizes[i] > max) max = sizes[i];
  }

  int ls = socket(AF_INET, SOCK_STREAM, 0);
  if (ls < 0) die("socket");
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (bind(ls, (struct sockaddr*)&a, sizeof a) || listen(ls, 1) ||
      getsockname(ls, (struct sockaddr*)&a, &len))
    die("listen on 127.0.0.1");
  pid_t child = fork();
  if (child < 0) die("fork");
  int fd;
  if (child == 0) {
    close(ls);
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr*)&a, sizeof a)) die("connect");
  } else {
    struct pollfd p = {ls, POLLIN, 0};
    if (poll(&p, 1, 10000) != 1) die("accept (10 s)");
    fd = accept(ls, NULL, NULL);
    if (fd < 0) die("accept");
    close(ls);
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  // Each side sends its own pattern (1 from the parent, 2 from the child).
  const char mine = child == 0 ? 2 : 1, theirs = child == 0 ? 1 : 2;
  char* s = malloc(max);
  char* r = malloc(max);
  double* t = calloc((size_t)iters, sizeof *t);
  if (!s || !r || !t) die("malloc");
  memset(s, mine, max);
  memset(r, 0, max);
  int status = 0;
  for (size_t i = 0; i < nsizes; ++i) {
    size_t n = sizes[i];
    for (int w = 0; w < iters / 10; ++w) exchange(fd, s, r, n, window);
    memset(r, 0, n);
    double cpu0 = cpu_s(RUSAGE_SELF);
    for (int k = 0; k < iters; ++k) {
      double t0 = now_s();
      exchange(fd, s, r, n, window);
      t[k] = now_s() - t0;
    }
    for (size_t b = 0; b < n; ++b) {
      if (r[b] != theirs) {
        fprintf(stderr, "tcp_exchange: byte %zu of %zu is %d, not the peer's %d\n", b, n, r[b],
                theirs);
        status = 1;
        break;
      }
    }
    // The child reports its CPU for the timed exchanges on the socket (after the data, so the
    // next size's exchange cannot start before the parent reads it).
    double cpu = cpu_s(RUSAGE_SELF) - cpu0, peer_cpu = 0;
    if (child == 0) {
      if (send(fd, &cpu, sizeof cpu, MSG_NOSIGNAL) != (ssize_t)sizeof cpu) die("send cpu");
    } else {
      struct pollfd p = {fd, POLLIN, 0};
      if (poll(&p, 1, 10000) != 1 ||
          recv(fd, &peer_cpu, sizeof peer_cpu, MSG_WAITALL) != (ssize_t)sizeof peer_cpu)
        die("receive the peer's cpu time");
      qsort(t, (size_t)iters, sizeof *t, cmp_double);
      printf(
          "tcp-exchange %zu B each way: median %.2f us, %.2f us CPU per exchange (both "
          "processes)\n",
          n, t[iters / 2] * 1e6, (cpu + peer_cpu) / iters * 1e6);
      fflush(stdout);
    }
  }
  close(fd);
  if (child == 0) return status;
  int child_status = 0;
  if (waitpid(child, &child_status, 0) != child) die("waitpid");
  if (!WIFEXITED(child_status) || WEXITSTATUS(child_status) != 0) status = 1;
  return status;
}
