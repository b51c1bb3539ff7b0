/*
 * faultfs: a FUSE pass-through file system that fails fdatasyncs on
 * demand, the way a disk whose write-back failed does.
 *
 *   faultfs BACKING_DIR CONTROL_FILE EVENT_LOG MOUNTPOINT
 *
 * Every call goes through to BACKING_DIR. Before each fsync it reads
 * CONTROL_FILE, which holds "GENERATION SUBSTRING [COUNT]": under a
 * GENERATION not used before, the next COUNT (default 1) fsyncs of paths
 * containing SUBSTRING fail with EIO, and the bytes written to that file since its last successful fsync
 * are overwritten with 0xEE in the backing file, as the kernel drops pages
 * it could not write back. As the kernel reports a write-back error once to
 * every file descriptor open at the time (errseq), every other descriptor
 * of that file open when an fsync fails gets EIO from its next fsync too:
 * an fsync already waiting when the bytes were lost must not vouch for them. Every fsync is logged to EVENT_LOG as
 * "ok PATH" or "failed PATH".
 *
 * Used by test/faults/fsync-once.test.ts; built there with cc and libfuse3.
 */
#define FUSE_USE_VERSION 31
#include <fuse.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/time.h>
#include <unistd.h>

static char backing[PATH_MAX];
static char control[PATH_MAX];
static char eventlog[PATH_MAX];
static long used_generation = 0;
static long failures_left = 0;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* Per backing descriptor: a hash of the path it is open on, and an error it has yet to report. */
#define MAX_FDS 65536
static unsigned long fd_path[MAX_FDS];
static char owes_error[MAX_FDS];

static unsigned long path_hash(const char *s)
{
	unsigned long h = 5381;
	for (; *s; s++) h = h * 33 + (unsigned char)*s;
	return h | 1; /* never 0, which marks a free slot */
}

static void track(int fd, const char *path)
{
	if (fd < 0 || fd >= MAX_FDS) return;
	pthread_mutex_lock(&lock);
	fd_path[fd] = path_hash(path);
	owes_error[fd] = 0;
	pthread_mutex_unlock(&lock);
}

/* Bytes written since the last good fsync, per path (a few files at a time). */
struct dirty {
	char path[PATH_MAX];
	off_t from, to;
};
#define MAX_DIRTY 64
static struct dirty dirty[MAX_DIRTY];

static void full(char *out, const char *path)
{
	snprintf(out, PATH_MAX, "%s%s", backing, path);
}

static struct dirty *dirty_of(const char *path, int create)
{
	struct dirty *free_slot = NULL;
	for (int i = 0; i < MAX_DIRTY; i++) {
		if (dirty[i].path[0] && strcmp(dirty[i].path, path) == 0) return &dirty[i];
		if (!dirty[i].path[0] && !free_slot) free_slot = &dirty[i];
	}
	if (!create || !free_slot) return NULL;
	snprintf(free_slot->path, PATH_MAX, "%s", path);
	free_slot->from = free_slot->to = -1;
	return free_slot;
}

static void note(const char *what, const char *path)
{
	FILE *f = fopen(eventlog, "a");
	if (!f) return;
	fprintf(f, "%s %s\n", what, path);
	fclose(f);
}

/* True when this fsync of `path` is one to fail. */
static int armed_for(const char *path)
{
	FILE *f = fopen(control, "r");
	if (!f) return 0;
	long gen = 0, count = 1;
	char pat[PATH_MAX] = "";
	int n = fscanf(f, "%ld %4095s %ld", &gen, pat, &count);
	fclose(f);
	if (n < 2) return 0;
	if (gen != used_generation) {
		used_generation = gen;
		failures_left = count;
	}
	if (failures_left <= 0 || !strstr(path, pat)) return 0;
	failures_left--;
	return 1;
}

static int ff_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
	char p[PATH_MAX];
	full(p, path);
	int r = fi ? fstat(fi->fh, st) : lstat(p, st);
	return r == -1 ? -errno : 0;
}

static int ff_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off, struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
	(void)off; (void)fi; (void)flags;
	char p[PATH_MAX];
	full(p, path);
	DIR *d = opendir(p);
	if (!d) return -errno;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) fill(buf, e->d_name, NULL, 0, 0);
	closedir(d);
	return 0;
}

static int ff_mkdir(const char *path, mode_t mode) { char p[PATH_MAX]; full(p, path); return mkdir(p, mode) == -1 ? -errno : 0; }
static int ff_rmdir(const char *path) { char p[PATH_MAX]; full(p, path); return rmdir(p) == -1 ? -errno : 0; }
static int ff_chmod(const char *path, mode_t mode, struct fuse_file_info *fi) { (void)fi; char p[PATH_MAX]; full(p, path); return chmod(p, mode) == -1 ? -errno : 0; }

static int ff_unlink(const char *path)
{
	char p[PATH_MAX];
	full(p, path);
	pthread_mutex_lock(&lock);
	struct dirty *d = dirty_of(path, 0);
	if (d) d->path[0] = 0;
	pthread_mutex_unlock(&lock);
	return unlink(p) == -1 ? -errno : 0;
}

static int ff_rename(const char *from, const char *to, unsigned int flags)
{
	if (flags) return -EINVAL;
	char a[PATH_MAX], b[PATH_MAX];
	full(a, from);
	full(b, to);
	pthread_mutex_lock(&lock);
	struct dirty *old = dirty_of(to, 0);
	if (old) old->path[0] = 0;
	struct dirty *d = dirty_of(from, 0);
	if (d) snprintf(d->path, PATH_MAX, "%s", to);
	pthread_mutex_unlock(&lock);
	return rename(a, b) == -1 ? -errno : 0;
}

static int ff_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
	char p[PATH_MAX];
	full(p, path);
	int r = fi ? ftruncate(fi->fh, size) : truncate(p, size);
	if (r == -1) return -errno;
	pthread_mutex_lock(&lock);
	struct dirty *d = dirty_of(path, 0);
	if (d && d->to > size) d->to = size;
	if (d && d->from >= d->to) d->from = d->to = -1;
	pthread_mutex_unlock(&lock);
	return 0;
}

static int ff_utimens(const char *path, const struct timespec tv[2], struct fuse_file_info *fi)
{
	(void)fi;
	char p[PATH_MAX];
	full(p, path);
	return utimensat(AT_FDCWD, p, tv, AT_SYMLINK_NOFOLLOW) == -1 ? -errno : 0;
}

static int ff_open(const char *path, struct fuse_file_info *fi)
{
	char p[PATH_MAX];
	full(p, path);
	int fd = open(p, fi->flags & ~O_CREAT);
	if (fd == -1) return -errno;
	track(fd, path);
	fi->fh = fd;
	fi->direct_io = 1; /* no page cache on top: what is read is what the backing file holds */
	return 0;
}

static int ff_create(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	char p[PATH_MAX];
	full(p, path);
	int fd = open(p, fi->flags, mode);
	if (fd == -1) return -errno;
	track(fd, path);
	fi->fh = fd;
	fi->direct_io = 1;
	return 0;
}

static int ff_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)path;
	ssize_t n = pread(fi->fh, buf, size, off);
	return n == -1 ? -errno : (int)n;
}

static int ff_write(const char *path, const char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
	ssize_t n = pwrite(fi->fh, buf, size, off);
	if (n == -1) return -errno;
	pthread_mutex_lock(&lock);
	struct dirty *d = dirty_of(path, 1);
	if (d) {
		if (d->from < 0 || off < d->from) d->from = off;
		if (off + n > d->to) d->to = off + n;
	}
	pthread_mutex_unlock(&lock);
	return (int)n;
}

static int ff_fsync(const char *path, int datasync, struct fuse_file_info *fi)
{
	pthread_mutex_lock(&lock);
	if (armed_for(path)) {
		struct dirty *d = dirty_of(path, 0);
		if (d && d->from >= 0) {
			size_t len = (size_t)(d->to - d->from);
			char *junk = malloc(len);
			if (junk) {
				memset(junk, 0xEE, len);
				if (pwrite(fi->fh, junk, len, d->from) < 0) perror("faultfs: overwrite");
				free(junk);
			}
			d->from = d->to = -1;
		}
		unsigned long h = path_hash(path);
		for (int fd = 0; fd < MAX_FDS; fd++)
			if (fd != (int)fi->fh && fd_path[fd] == h) owes_error[fd] = 1;
		pthread_mutex_unlock(&lock);
		note("failed", path);
		return -EIO;
	}
	if (fi->fh < MAX_FDS && owes_error[fi->fh]) {
		owes_error[fi->fh] = 0;
		pthread_mutex_unlock(&lock);
		note("owed", path);
		return -EIO;
	}
	int r = datasync ? fdatasync(fi->fh) : fsync(fi->fh);
	if (r == 0) {
		struct dirty *d = dirty_of(path, 0);
		if (d) d->from = d->to = -1;
	}
	pthread_mutex_unlock(&lock);
	note(r == 0 ? "ok" : "error", path);
	return r == -1 ? -errno : 0;
}

static int ff_fsyncdir(const char *path, int datasync, struct fuse_file_info *fi) { (void)path; (void)datasync; (void)fi; return 0; }

static int ff_release(const char *path, struct fuse_file_info *fi)
{
	(void)path;
	if (fi->fh < MAX_FDS) {
		pthread_mutex_lock(&lock);
		fd_path[fi->fh] = 0;
		owes_error[fi->fh] = 0;
		pthread_mutex_unlock(&lock);
	}
	close(fi->fh);
	return 0;
}

static int ff_statfs(const char *path, struct statvfs *st)
{
	(void)path;
	return statvfs(backing, st) == -1 ? -errno : 0;
}

static const struct fuse_operations ops = {
	.getattr = ff_getattr,
	.readdir = ff_readdir,
	.mkdir = ff_mkdir,
	.rmdir = ff_rmdir,
	.unlink = ff_unlink,
	.rename = ff_rename,
	.chmod = ff_chmod,
	.truncate = ff_truncate,
	.utimens = ff_utimens,
	.open = ff_open,
	.create = ff_create,
	.read = ff_read,
	.write = ff_write,
	.fsync = ff_fsync,
	.fsyncdir = ff_fsyncdir,
	.release = ff_release,
	.statfs = ff_statfs,
};

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: faultfs BACKING_DIR CONTROL_FILE EVENT_LOG MOUNTPOINT\n");
		return 2;
	}
	if (!realpath(argv[1], backing) || !realpath(argv[2], control)) {
		perror("faultfs: realpath");
		return 2;
	}
	snprintf(eventlog, PATH_MAX, "%s", argv[3]);
	char *fargv[] = {argv[0], "-f", "-o", "default_permissions,allow_other", argv[4], NULL};
	return fuse_main(5, fargv, &ops, NULL);
}
