package install

import (
	"io/fs"
	"strconv"
	"syscall"
)

// ownerGID returns the group ID owning a file, as a string for os/user.
func ownerGID(fi fs.FileInfo) string {
	return strconv.FormatUint(uint64(fi.Sys().(*syscall.Stat_t).Gid), 10)
}
