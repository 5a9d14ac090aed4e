/* The benches' launcher (bench/harness.py compiles it once with `cc -O2`).

   launch OUT CGROUP_PROCS -- COMMAND [ARG...]

   Runs COMMAND with this process's stdin, stdout and stderr and writes one line to OUT:
       <wall ns> <peak RSS KiB> <user us> <system us> <exit status>
   - wall: CLOCK_MONOTONIC from before the fork to after wait4 — the command alone, not this
     launcher's start nor the Python bench's;
   - peak RSS: wait4's ru_maxrss of COMMAND and the children it waited for. This launcher is a
     few hundred KiB when it forks, so the figure is the command's own (a child forked by a bench
     that has touched 600 MiB starts its ru_maxrss at that high-water mark: issue 28);
   - user/system: the same rusage (children nobody waited for are missing: that is what the
     cgroup, CGROUP_PROCS, is for; "-" for none). The child moves itself into that cgroup before
     exec, so nothing it starts escapes the count.
   Exit status: COMMAND's (128 + signal when killed), 127 when it cannot be run. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 5 || strcmp(argv[3], "--") != 0) {
        fprintf(stderr, "usage: launch OUT CGROUP_PROCS|- -- COMMAND [ARG...]\n");
        return 127;
    }
    const char *out = argv[1], *procs = argv[2];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pid_t pid = fork();
    if (pid < 0) { perror("launch: fork"); return 127; }
    if (pid == 0) {
        if (strcmp(procs, "-") != 0) {
            int fd = open(procs, O_WRONLY | O_CLOEXEC);
            if (fd < 0 || write(fd, "0\n", 2) != 2) { perror("launch: cgroup.procs"); _exit(127); }
            close(fd);
        }
        execvp(argv[4], argv + 4);
        fprintf(stderr, "launch: %s: %s\n", argv[4], strerror(errno));
        _exit(127);
    }
    int status;
    struct rusage ru;
    while (wait4(pid, &status, 0, &ru) < 0) {
        if (errno != EINTR) { perror("launch: wait4"); return 127; }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long long wall = (long long)(t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    FILE *f = fopen(out, "w");
    if (!f) { perror("launch: OUT"); return 127; }
    fprintf(f, "%lld %ld %lld %lld %d\n", wall, ru.ru_maxrss,
            (long long)ru.ru_utime.tv_sec * 1000000LL + ru.ru_utime.tv_usec,
            (long long)ru.ru_stime.tv_sec * 1000000LL + ru.ru_stime.tv_usec, code);
    fclose(f);
    return code;
}
