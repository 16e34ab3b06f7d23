// tcp_stream.c: the floor of a one-way stream of small messages over a TCP
// socket on loopback, the pattern of a 2-rank Broadcast loop (the root sends
// call after call; the other rank receives each).
//
// Two processes (a fork) joined by one TCP connection on 127.0.0.1 with
// TCP_NODELAY. The sender writes ITERS messages of SIZE bytes, one send() a
// message; the receiver reads each message whole (recv with MSG_DONTWAIT,
// spinning on EAGAIN, as MPI libraries and tutti poll). After every WINDOW
// messages the receiver answers one byte and the sender waits for it, so
// the sender cannot run further ahead than WINDOW messages (Open MPI's
// eager sends and tutti's both run ahead; a window of 0 lets the sender go
// unbounded). Prints the median, over REPS repetitions, of the receiver's
// time per message, which is what `coll_perf`'s Broadcast and `tutti perf
// broadcast -n 2` time (the slower rank's loop).
//
//   gcc -O2 -o /tmp/tcp_stream bench/peers/tcp_stream.c
//   /tmp/tcp_stream [SIZE=8] [ITERS=20000] [WINDOW=0] [REPS=5] [x]
//
// With a fifth argument `x`, both processes exchange instead: in each
// iteration each sends SIZE bytes and then reads the other's SIZE bytes
// (the pattern of a 2-rank AllReduce or Send/Recv), and the time per
// iteration is printed; WINDOW is ignored.
//
// On loopback a send() carries the segment through the whole receive path
// (the softirq runs on the sender's core), so the sender's cost per message
// is most of the floor.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void die(const char *what) {
  perror(what);
  exit(1);
}

// Reads n bytes, spinning on EAGAIN.
static void recv_all(int fd, char *b, size_t n) {
  size_t d = 0;
  while (d < n) {
    ssize_t r = recv(fd, b + d, n - d, MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (r <= 0) die("recv");
    d += (size_t)r;
  }
}

static void send_all(int fd, const char *b, size_t n) {
  size_t d = 0;
  while (d < n) {
    ssize_t r = send(fd, b + d, n - d, 0);
    if (r <= 0) die("send");
    d += (size_t)r;
  }
}

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  size_t size = argc > 1 ? strtoul(argv[1], 0, 0) : 8;
  long iters = argc > 2 ? strtol(argv[2], 0, 0) : 20000;
  long window = argc > 3 ? strtol(argv[3], 0, 0) : 0;
  int reps = argc > 4 ? atoi(argv[4]) : 5;
  int exchange = argc > 5 && !strcmp(argv[5], "x");
  if (exchange) window = 0;
  if (size == 0 || iters <= 0 || reps <= 0 || reps > 100 || window < 0) {
    fprintf(stderr, "usage: %s [SIZE>0] [ITERS>0] [WINDOW>=0] [REPS 1-100] [x]\n", argv[0]);
    return 2;
  }
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  if (ls < 0) die("socket");
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 1)) die("bind/listen");
  socklen_t al = sizeof a;
  if (getsockname(ls, (struct sockaddr *)&a, &al)) die("getsockname");
  int one = 1;
  char *buf = calloc(1, size);
  if (!buf) die("calloc");
  pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) {  // the sender (the Broadcast's root)
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) die("connect");
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char ack;
    for (int r = 0; r < reps + 1; r++) {  // one warm-up repetition
      recv_all(fd, &ack, 1);              // the receiver is ready
      for (long i = 1; i <= iters; i++) {
        send_all(fd, buf, size);
        if (exchange) recv_all(fd, buf, size);
        if (window && i % window == 0) recv_all(fd, &ack, 1);
      }
    }
    _exit(0);
  }
  int fd = accept(ls, 0, 0);
  if (fd < 0) die("accept");
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  double per[101];
  for (int r = 0; r < reps + 1; r++) {
    char go = 1;
    send_all(fd, &go, 1);
    double t0 = now();
    for (long i = 1; i <= iters; i++) {
      if (exchange) send_all(fd, buf, size);
      recv_all(fd, buf, size);
      if (window && i % window == 0) send_all(fd, &go, 1);
    }
    per[r] = (now() - t0) / (double)iters * 1e6;
  }
  waitpid(pid, 0, 0);
  qsort(per + 1, (size_t)reps, sizeof per[0], cmpd);
  printf("tcp_stream%s size=%zu iters=%ld window=%ld reps=%d median_us_per_msg=%.3f min=%.3f max=%.3f\n",
         exchange ? "_exchange" : "", size, iters, window, reps, per[1 + reps / 2], per[1], per[reps]);
  return 0;
}
