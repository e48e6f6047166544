/*
 * hapkcs11-helper — the process that runs hagroup's engine for one client
 * of libhapkcs11.so that cannot run it itself (a forked child: its Go
 * runtime did not survive the fork) or asked not to. The library starts
 * it (spawn + exec: a fresh process and runtime) with the socket to its
 * client as fd 3 and the library's path as its argument; it loads that
 * library and serves the client until the client closes the socket
 * (it exits, or finalizes). It is nobody else's: it listens nowhere.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* close_inherited closes every descriptor but stdio and the socket: the
 * client's listening sockets, files and pipes are not the helper's. */
static void close_inherited(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	if (d == NULL) {
		for (int fd = 4; fd < 1024; fd++)
			close(fd);
		return;
	}
	while ((e = readdir(d)) != NULL) {
		int fd = atoi(e->d_name);
		if (fd > 3 && fd != dirfd(d))
			close(fd);
	}
	closedir(d);
}

int main(int argc, char **argv)
{
	struct stat st;
	int type = 0;
	socklen_t len = sizeof type;

	if (argc != 2 || argv[1][0] != '/') {
		fprintf(stderr, "usage: hapkcs11-helper /path/of/libhapkcs11.so (started by libhapkcs11.so, not by hand)\n");
		return 2;
	}
	if (fstat(3, &st) != 0 || !S_ISSOCK(st.st_mode) ||
	    getsockopt(3, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) {
		fprintf(stderr, "hapkcs11-helper: fd 3 is not the socket libhapkcs11.so gives its helper\n");
		return 2;
	}
	close_inherited();
	void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (lib == NULL) {
		fprintf(stderr, "hapkcs11-helper: %s\n", dlerror());
		return 1;
	}
	int (*serve)(int) = (int (*)(int))dlsym(lib, "hap_helper_serve");
	if (serve == NULL) {
		fprintf(stderr, "hapkcs11-helper: %s has no hap_helper_serve: not a libhapkcs11.so of this version\n", argv[1]);
		return 1;
	}
	return serve(3);
}
