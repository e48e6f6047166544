// Package install tests hagroup as an operator installs it: the .deb that
// `make deb` builds, installed, run and removed with dpkg, and the man page
// of the configuration against the configuration's schema.
package install
