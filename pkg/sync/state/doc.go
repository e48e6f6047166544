// Package state keeps the group's state on the members (DESIGN.md, "Group
// state on the members"): what every process on every host must agree on — the tombstones, the
// markers saying how far each member has caught up — is kept on the
// members themselves, as private token objects labelled Label, of
// the form the member's make takes (stateform.go). They are the group's,
// not the application's: listings, the virtual slot's searches and the
// plan leave them out (object.Hidden), and they
// are merged by their own rule instead of being copied as objects.
//
// Tokens have no transactions, so an object written here is never
// changed (the tombstone registers of pkg/sync/tombstone, written in
// place by their one owner, are the exception, with their own rule): a writer
// creates a new object holding what it read merged with what it adds, and
// only then destroys the objects it read. A reader takes the union of
// every object under the label. A concurrent writer's object, created
// after this writer's read, is never destroyed by it, so no record is lost
// when two processes or hosts write at once; at worst an extra object
// stays until the next write folds it in.
//
// The behind marks (marker.go) are the simplest such state; the
// tombstones and intents (pkg/sync/tombstone) are written through Write,
// Template, Read and DestroyIfSame here.
package state
