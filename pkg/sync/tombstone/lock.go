package tombstone

import "os"

// syncDir fsyncs a directory so that a file created or renamed in it
// survives a crash.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
