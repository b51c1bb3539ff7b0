/*
 * A device that cannot run keyop (an ESP32 and the like) talking to a
 * board's keyop straight over MQTT 3.1.1 on TLS, the way firmware does it:
 * a plain MQTT client over a TLS library (OpenSSL here, mbedTLS on a
 * microcontroller), the device's certificate issued by the keyop CA
 * (`keyop cert issue --name <device>`), whose CN is its MQTT user.
 *
 * It subscribes to cmd/<name>/#, publishes sensors/<name>/temp at QoS 1
 * once a second (each one acknowledged only once keyop has stored it)
 * until a command arrives, prints the command, and disconnects.
 *
 *   cc -O2 -o mqtt_tls_device mqtt_tls_device.c -lssl -lcrypto
 *   ./mqtt_tls_device HOST PORT CA.crt DEVICE.crt DEVICE.key NAME
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static SSL *ssl;

static void die(const char *what) {
    fprintf(stderr, "mqtt_tls_device: %s\n", what);
    ERR_print_errors_fp(stderr);
    exit(1);
}

static void send_all(const unsigned char *buf, size_t len) {
    while (len > 0) {
        int n = SSL_write(ssl, buf, (int)len);
        if (n <= 0) die("TLS write failed");
        buf += n;
        len -= (size_t)n;
    }
}

/* Reads exactly len bytes; returns 0 on timeout (SO_RCVTIMEO), 1 when done. */
static int read_exact(unsigned char *buf, size_t len) {
    while (len > 0) {
        int n = SSL_read(ssl, buf, (int)len);
        if (n <= 0) {
            int e = SSL_get_error(ssl, n);
            if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_SYSCALL) return 0;
            die("TLS read failed (connection closed by keyop?)");
        }
        buf += n;
        len -= (size_t)n;
    }
    return 1;
}

/* One MQTT packet: its first byte and body (malloc'd). Returns 0 on timeout. */
static int read_packet(unsigned char *type, unsigned char **body, size_t *len) {
    unsigned char b;
    if (!read_exact(&b, 1)) return 0;
    *type = b;
    size_t n = 0, mul = 1;
    for (int i = 0; i < 4; i++) {
        if (!read_exact(&b, 1)) die("truncated remaining length");
        n += (b & 0x7f) * mul;
        mul *= 128;
        if (!(b & 0x80)) break;
    }
    *body = malloc(n + 1);
    if (!*body) die("out of memory");
    if (n > 0 && !read_exact(*body, n)) die("truncated packet");
    *len = n;
    return 1;
}

/* Appends an MQTT remaining length; returns its size. */
static size_t put_length(unsigned char *out, size_t n) {
    size_t i = 0;
    do {
        unsigned char b = n % 128;
        n /= 128;
        if (n > 0) b |= 0x80;
        out[i++] = b;
    } while (n > 0);
    return i;
}

static size_t put_string(unsigned char *out, const char *s) {
    size_t n = strlen(s);
    out[0] = (unsigned char)(n >> 8);
    out[1] = (unsigned char)(n & 0xff);
    memcpy(out + 2, s, n);
    return n + 2;
}

/* A whole packet: first byte, remaining length, body. */
static void send_packet(unsigned char first, const unsigned char *body, size_t len) {
    unsigned char head[5];
    head[0] = first;
    size_t h = 1 + put_length(head + 1, len);
    unsigned char *buf = malloc(h + len);
    if (!buf) die("out of memory");
    memcpy(buf, head, h);
    memcpy(buf + h, body, len);
    send_all(buf, h + len);
    free(buf);
}

static int tcp_connect(const char *host, const char *port) {
    struct addrinfo hints = {0}, *res;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, port, &hints, &res) != 0) die("cannot resolve the host");
    int fd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
    if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen) != 0) die("cannot connect");
    freeaddrinfo(res);
    struct timeval tv = {1, 0}; /* reads wake every second: the publish loop's tick */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: %s HOST PORT CA.crt DEVICE.crt DEVICE.key NAME\n", argv[0]);
        return 2;
    }
    const char *host = argv[1], *port = argv[2], *name = argv[6];

    /* TLS: keyop's certificate checked against the keyop CA and the address dialled; ours presented. */
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) die("no TLS context");
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    if (SSL_CTX_load_verify_locations(ctx, argv[3], NULL) != 1) die("cannot read the CA certificate");
    if (SSL_CTX_use_certificate_file(ctx, argv[4], SSL_FILETYPE_PEM) != 1) die("cannot read the device certificate");
    if (SSL_CTX_use_PrivateKey_file(ctx, argv[5], SSL_FILETYPE_PEM) != 1) die("cannot read the device key");
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    int fd = tcp_connect(host, port);
    ssl = SSL_new(ctx);
    X509_VERIFY_PARAM *param = SSL_get0_param(ssl);
    if (X509_VERIFY_PARAM_set1_ip_asc(param, host) != 1) X509_VERIFY_PARAM_set1_host(param, host, 0);
    SSL_set_tlsext_host_name(ssl, host);
    SSL_set_fd(ssl, fd);
    if (SSL_connect(ssl) != 1) die("TLS handshake failed");

    /* CONNECT: MQTT 3.1.1, clean session, keep-alive 30 s, client id = device name. */
    unsigned char body[512];
    size_t n = put_string(body, "MQTT");
    body[n++] = 4;    /* protocol level 3.1.1 */
    body[n++] = 0x02; /* clean session */
    body[n++] = 0;
    body[n++] = 30;
    n += put_string(body + n, name);
    send_packet(0x10, body, n);

    unsigned char type, *pkt;
    size_t len;
    while (!read_packet(&type, &pkt, &len)) {}
    if ((type >> 4) != 2 || len < 2 || pkt[1] != 0) die("CONNACK refused the login");
    free(pkt);

    /* SUBSCRIBE cmd/<name>/# at QoS 1, packet id 1. */
    char topic[256];
    snprintf(topic, sizeof topic, "cmd/%s/#", name);
    n = 0;
    body[n++] = 0;
    body[n++] = 1;
    n += put_string(body + n, topic);
    body[n++] = 1;
    send_packet(0x82, body, n);

    char telemetry[256];
    snprintf(telemetry, sizeof telemetry, "sensors/%s/temp", name);
    unsigned short next_id = 2;
    time_t deadline = time(NULL) + 20;
    int got_command = 0;
    while (!got_command && time(NULL) < deadline) {
        /* PUBLISH telemetry at QoS 1; keyop answers PUBACK once it is stored. */
        n = put_string(body, telemetry);
        unsigned short id = next_id++;
        body[n++] = (unsigned char)(id >> 8);
        body[n++] = (unsigned char)(id & 0xff);
        memcpy(body + n, "22.5", 4);
        n += 4;
        send_packet(0x32, body, n);
        /* Whatever comes until the next tick: acks, and perhaps the command. */
        while (read_packet(&type, &pkt, &len)) {
            unsigned char kind = type >> 4;
            if (kind == 4 && len >= 2 && ((pkt[0] << 8) | pkt[1]) == id) printf("published %s (PUBACK %u)\n", telemetry, id);
            if (kind == 3) {
                int qos = (type >> 1) & 3;
                size_t tl = (size_t)((pkt[0] << 8) | pkt[1]);
                size_t at = 2 + tl;
                unsigned char ack[2] = {0, 0};
                if (qos > 0) {
                    ack[0] = pkt[at];
                    ack[1] = pkt[at + 1];
                    at += 2;
                }
                printf("command %.*s: %.*s\n", (int)tl, (char *)pkt + 2, (int)(len - at), (char *)pkt + at);
                if (qos == 1) send_packet(0x40, ack, 2);
                got_command = 1;
            }
            free(pkt);
            if (got_command) break;
        }
    }
    unsigned char none = 0;
    send_packet(0xe0, &none, 0); /* DISCONNECT */
    SSL_shutdown(ssl);
    SSL_free(ssl);
    close(fd);
    SSL_CTX_free(ctx);
    if (!got_command) die("no command within 20 s");
    fflush(stdout);
    return 0;
}
