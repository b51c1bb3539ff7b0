/*
 * Publish one JSON message to keyop over its Unix socket, in plain C with
 * POSIX sockets (no libraries). Prints the agent's answer; exits 0 on 201.
 *
 *   cc -O2 -o publish publish.c
 *   ./publish SOCKET CHANNEL 'JSON-PAYLOAD' [TYPE]
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static int write_all(int fd, const char *buf, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 4 || argc > 5) {
        fprintf(stderr, "usage: %s SOCKET CHANNEL 'JSON-PAYLOAD' [TYPE]\n", argv[0]);
        return 2;
    }
    const char *sock_path = argv[1], *channel = argv[2], *payload = argv[3];
    const char *type = argc == 5 ? argv[4] : "example.c";

    /* The agent may answer (e.g. 400 for a bad channel) and close before the whole body is
       sent: a write then fails with EPIPE, which must not kill us before we read the answer. */
    signal(SIGPIPE, SIG_IGN);

    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(sock_path) >= sizeof addr.sun_path) {
        fprintf(stderr, "socket path too long\n");
        return 2;
    }
    strcpy(addr.sun_path, sock_path);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
        fprintf(stderr, "cannot connect to %s: %s\n", sock_path, strerror(errno));
        return 1;
    }

    /* The payload is inserted as given: it must already be valid JSON. */
    char body[65536];
    int blen = snprintf(body, sizeof body, "{\"type\":\"%s\",\"payload\":%s}", type, payload);
    if (blen < 0 || (size_t)blen >= sizeof body) {
        fprintf(stderr, "message too long for this example\n");
        return 2;
    }
    char head[1024];
    int hlen = snprintf(head, sizeof head,
                        "POST /v1/channels/%s/messages HTTP/1.1\r\n"
                        "Host: keyop\r\n"
                        "Content-Type: application/json\r\n"
                        "Content-Length: %d\r\n"
                        "Connection: close\r\n\r\n",
                        channel, blen);
    if (hlen < 0 || (size_t)hlen >= sizeof head) {
        fprintf(stderr, "channel name too long for this example\n");
        return 2;
    }
    if ((write_all(fd, head, (size_t)hlen) || write_all(fd, body, (size_t)blen)) && errno != EPIPE) {
        fprintf(stderr, "write failed: %s\n", strerror(errno));
        return 1;
    }

    /* Read the whole answer (the agent closes after it: Connection: close). */
    char resp[65536];
    size_t got = 0;
    ssize_t n;
    while (got < sizeof resp - 1 && (n = read(fd, resp + got, sizeof resp - 1 - got)) != 0) {
        if (n < 0) {
            if (errno == EINTR) continue;
            fprintf(stderr, "read failed: %s\n", strerror(errno));
            return 1;
        }
        got += (size_t)n;
    }
    resp[got] = '\0';
    close(fd);

    int status = 0;
    if (sscanf(resp, "HTTP/1.1 %d", &status) != 1) {
        fprintf(stderr, "not an HTTP answer\n");
        return 1;
    }
    const char *json = strstr(resp, "\r\n\r\n");
    printf("%d %s\n", status, json ? json + 4 : "");
    return status == 201 ? 0 : 1;
}
