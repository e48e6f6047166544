package state

import (
	"context"
	"fmt"
	"strings"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

// Behind marks (DESIGN.md, "Group state on the members"): how far each
// member has caught up, told by the members that did catch up. A process
// that changes an object through the group while a member is out of its
// rotation leaves, on every member that took the change, a mark naming
// the member that missed it — after the change, so that a catch-up that
// read the mark has the change in its listing. A process that opens the
// group reads the marks (one search per member, none found in a healthy
// group) and keeps a marked member out of rotation until it is caught
// up; the catch-up removes the marks it read before its listing. A mark
// left after that is a change the catch-up may have missed: the member is
// caught up again. The marks need no clock and no counter; a member is
// current when no member it can reach holds a mark naming it.

// MarkApplication is the CKA_APPLICATION of behind marks.
const MarkApplication = "hagroup/behind"

const markKind = "behind:"

// MarkLabel is the CKA_LABEL of a mark saying member missed a change of
// the group with the given serial.
func MarkLabel(groupSerial, member string) string {
	return Label(groupSerial, markKind+member)
}

// Mark is one behind mark read from a member.
type Mark struct {
	// Member is the member that missed a change.
	Member string
	// Writer names the process that made the change (a random id).
	Writer string
	// On is the member the mark was read from; Handle its handle there.
	On     *slot.Slot
	Handle pkcs11.ObjectHandle
}

// ReadMarks returns the behind marks of the group with serial
// groupSerial on s, which must be logged in (ErrNotLoggedIn otherwise).
// Cost: one FindObjects, and one GetAttributes per mark found.
func ReadMarks(ctx context.Context, s *slot.Slot, groupSerial string) ([]Mark, error) {
	if !s.LoggedIn() {
		return nil, fmt.Errorf("member %s: read behind marks: %w", s.Name(), ErrNotLoggedIn)
	}
	hs, err := Find(ctx, s, MarkApplication)
	if err != nil {
		return nil, fmt.Errorf("member %s: find behind marks: %w", s.Name(), err)
	}
	prefix := MarkLabel(groupSerial, "")
	var out []Mark
	for _, h := range hs {
		r, ok, err := Read(ctx, s, h, MarkApplication, true)
		if err != nil {
			if object.IsGone(err) {
				continue // cleared meanwhile
			}
			return nil, fmt.Errorf("member %s: read behind mark (object %d): %w", s.Name(), h, err)
		}
		if !ok {
			continue // being written, or not a mark
		}
		if !strings.HasPrefix(r.Label, prefix) || len(r.Label) == len(prefix) {
			continue // another group's
		}
		out = append(out, Mark{Member: r.Label[len(prefix):], Writer: string(r.Value), On: s, Handle: h})
	}
	return out, nil
}

// WriteMark leaves on s a mark saying member missed a change that writer
// made (Write: a state object of s's form), and returns its handle.
func WriteMark(ctx context.Context, s *slot.Slot, groupSerial, member, writer string) (pkcs11.ObjectHandle, error) {
	o, err := Write(ctx, s, MarkLabel(groupSerial, member), MarkApplication, []byte(writer), nil)
	if err != nil {
		return 0, fmt.Errorf("mark %s behind: %w", member, err)
	}
	return o.Handle, nil
}

// ClearMark removes mark k from the member it was read from; one already
// gone is no error. The handle is checked to be that mark still (label
// and writer: DestroyIfSame) before it is destroyed: a handle kept across
// a re-login may name another object by then.
func ClearMark(ctx context.Context, groupSerial string, k Mark) error {
	o := Object{Handle: k.Handle, Value: []byte(k.Writer)}
	if err := DestroyIfSame(ctx, k.On, MarkLabel(groupSerial, k.Member), MarkApplication, o); err != nil {
		return fmt.Errorf("clear the mark that %s is behind: %w", k.Member, err)
	}
	return nil
}
