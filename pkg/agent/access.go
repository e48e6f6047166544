package agent

import (
	"errors"
	"fmt"
	"net"
	"os/user"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"
)

// Level is what a connection may do.
type Level int

// Access levels, ordered: a route needing LevelRead is open to LevelWrite.
const (
	LevelNone   Level = iota // refused: every route answers permission_denied
	LevelReport              // an application's engine reporting (pkg/fleet): /v1/report only
	LevelRead                // status, listgroups, clients, halog, synchronize --check
	LevelWrite               // recover, synchronize, reload
)

func (l Level) String() string {
	switch l {
	case LevelReport:
		return "report"
	case LevelRead:
		return "read"
	case LevelWrite:
		return "write"
	default:
		return "none"
	}
}

// Peer is the identity of the process at the other end of a connection.
type Peer struct {
	PID, UID, GID int
	Known         bool // false: the connection carried no credentials
}

// Decision is the access granted to one connection, with the reason.
type Decision struct {
	Peer   Peer
	Level  Level
	Reason string
}

// Policy decides access from peer credentials. The zero Policy grants
// write to root only and refuses everyone else.
type Policy struct {
	// AgentUID is the agent's own uid; it may write.
	AgentUID int
	// AllowedUIDs may write.
	AllowedUIDs []int
	// AllowedGroup names a group whose members (primary or supplementary)
	// may write. Resolved on each decision so membership changes apply to
	// the next connection.
	AllowedGroup string
	// OthersReadOnly lets every other local user read; false refuses them.
	OthersReadOnly bool
	// GroupIDs returns the group ids of a uid; nil uses os/user. Tests
	// and systems without /etc/group inject their own.
	GroupIDs func(uid int) ([]int, error)
}

// Decide returns the access for peer. It never fails: a lookup problem
// costs the peer the write grant it would have given, and says so.
func (p Policy) Decide(peer Peer) Decision {
	d := Decision{Peer: peer}
	if !peer.Known {
		d.Reason = "no peer credentials on the connection"
		return d
	}
	switch {
	case peer.UID == 0:
		d.Level, d.Reason = LevelWrite, "root"
		return d
	case peer.UID == p.AgentUID:
		d.Level, d.Reason = LevelWrite, "the agent's own uid"
		return d
	case slices.Contains(p.AllowedUIDs, peer.UID):
		d.Level, d.Reason = LevelWrite, "uid listed in allowed_uids"
		return d
	}
	var groupNote string
	if p.AllowedGroup != "" {
		in, err := p.inGroup(peer)
		switch {
		case err != nil:
			groupNote = fmt.Sprintf("; allowed_group %q not checked: %v", p.AllowedGroup, err)
		case in:
			d.Level, d.Reason = LevelWrite, fmt.Sprintf("member of allowed_group %q", p.AllowedGroup)
			return d
		}
	}
	if p.OthersReadOnly {
		d.Level, d.Reason = LevelRead, "other local user: read-only (others_read_only)"+groupNote
		return d
	}
	// Every local user's applications run the engine and report what
	// they see; that is all they may do.
	d.Level, d.Reason = LevelReport, "other local user: may only report (others_read_only = false)"+groupNote
	return d
}

func (p Policy) inGroup(peer Peer) (bool, error) {
	g, err := lookupGroup(p.AllowedGroup)
	if err != nil {
		return false, err
	}
	if peer.GID == g {
		return true, nil
	}
	ids := p.GroupIDs
	if ids == nil {
		ids = userGroupIDs
	}
	gids, err := ids(peer.UID)
	if err != nil {
		return false, err
	}
	return slices.Contains(gids, g), nil
}

// lookupGroup resolves a group name (or a numeric gid) to its gid.
func lookupGroup(name string) (int, error) {
	if n, err := strconv.Atoi(name); err == nil {
		return n, nil
	}
	g, err := user.LookupGroup(name)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(g.Gid)
}

// LookupGroupID resolves a group name or numeric gid, for callers that
// chown the socket to allowed_group.
func LookupGroupID(name string) (int, error) { return lookupGroup(name) }

func userGroupIDs(uid int) ([]int, error) {
	u, err := user.LookupId(strconv.Itoa(uid))
	if err != nil {
		return nil, err
	}
	ss, err := u.GroupIds()
	if err != nil {
		return nil, err
	}
	out := make([]int, 0, len(ss))
	for _, s := range ss {
		if n, err := strconv.Atoi(s); err == nil {
			out = append(out, n)
		}
	}
	return out, nil
}

// PeerOf reads SO_PEERCRED from a Unix connection. Other connections (a
// test's TCP listener, say) yield an unknown Peer.
func PeerOf(c net.Conn) (Peer, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return Peer{}, errors.New("not a Unix socket connection")
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return Peer{}, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return Peer{}, err
	}
	if credErr != nil {
		return Peer{}, fmt.Errorf("SO_PEERCRED: %w", credErr)
	}
	return Peer{PID: int(cred.Pid), UID: int(cred.Uid), GID: int(cred.Gid), Known: true}, nil
}
