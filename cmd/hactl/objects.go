package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/agent/report"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/sync"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/spf13/cobra"
)

// objectsResult is hagroup objects' report (--json).
type objectsResult struct {
	SchemaVersion int            `json:"schemaVersion"`
	Group         string         `json:"group"`
	Members       []memberLook   `json:"members"`
	Objects       []objectCopies `json:"objects"`
}

// memberLook is whether a member could be read.
type memberLook struct {
	Name  string `json:"name"`
	Read  bool   `json:"read"`
	Error string `json:"error,omitempty"`
}

// objectCopies is one object of the group, by identity, and where it is.
type objectCopies struct {
	Identity string   `json:"identity"`
	Class    string   `json:"class"`
	KeyType  string   `json:"keyType,omitempty"`
	ID       string   `json:"id"`
	Label    string   `json:"label"`
	Holders  []string `json:"holders"`
	Lacking  []string `json:"lacking"`
	// Differs names the members whose copy has another fingerprint than
	// the first holder's: the same identity, other key material.
	Differs []string `json:"differs"`
}

func newObjectsCmd(a *app) *cobra.Command {
	var group string
	cmd := &cobra.Command{
		Use:   "objects",
		Short: "List each object of a group with the members that hold and lack it",
		Long: `Read every member of a group (opened here, logged in with the members' own
PIN sources, changing nothing) and list each object by its identity (class,
key type, CKA_ID, CKA_LABEL) with the members that hold a copy, those that
lack one, and those whose copy has other key material under the same
identity. The group's own objects (domain keys, group state) are left out.
A member that cannot be read is named, and lacks nothing it can be said to
lack.

Exit 0 when every member was read and holds every object alike; 3 when an
object is lacked or differs somewhere, or a member could not be read
(synchronize repairs what it can; deleted objects whose tombstones have not
reached every member show as lacked until it runs).`,
		Example: `  hactl hagroup objects --group signing
  hactl hagroup objects --group signing --json`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			c, g, err := a.loadGroup(group)
			if err != nil {
				return err
			}
			res := lookAtObjects(cmd.Context(), a, *g, c.Settings(g))
			if err := a.print(res, func(w io.Writer) error {
				for _, m := range res.Members {
					if !m.Read {
						fmt.Fprintf(w, "member %s not read: %s\n", m.Name, m.Error)
					}
				}
				return renderTable(w, table(makeObjectsTable(res)))
			}); err != nil {
				return err
			}
			if n := objectsProblems(res); n > 0 {
				msg := fmt.Sprintf("group %q: %d problem(s): objects lacked or differing, or members not read", group, n)
				if !a.jsonOut() {
					fmt.Fprintln(a.out, msg)
				}
				return &problemError{msg: msg, shown: !a.jsonOut()}
			}
			return nil
		}),
	}
	cmd.Flags().StringVar(&group, "group", "", "the group")
	cmd.Flags().Bool("json", false, "print the report as JSON")
	cmd.MarkFlagRequired("group")
	return cmd
}

// lookAtObjects reads every member of g and sorts the objects found.
func lookAtObjects(ctx context.Context, a *app, g config.Group, set config.Settings) objectsResult {
	res := objectsResult{SchemaVersion: agent.SchemaVersion, Group: g.Label, Members: []memberLook{}, Objects: []objectCopies{}}
	byKey := map[string]*objectCopies{}
	fps := map[string][]byte{} // identity key → the first holder's fingerprint
	var read []string
	for _, m := range g.Members {
		objs, err := readMember(ctx, a, m, set)
		if err != nil {
			res.Members = append(res.Members, memberLook{Name: m.Name, Error: err.Error()})
			continue
		}
		res.Members = append(res.Members, memberLook{Name: m.Name, Read: true})
		read = append(read, m.Name)
		for _, o := range objs {
			k := o.Key()
			oc, ok := byKey[k]
			if !ok {
				oc = &objectCopies{Identity: o.String(), Class: object.ClassName(o.Class), ID: fmt.Sprintf("%x", o.ID), Label: o.Label,
					Holders: []string{}, Lacking: []string{}, Differs: []string{}}
				if o.KeyType != object.NoKeyType {
					oc.KeyType = object.KeyTypeName(o.KeyType)
				}
				byKey[k] = oc
				fps[k] = o.Fingerprint
			} else if o.Fingerprint != nil && fps[k] != nil && !slices.Equal(o.Fingerprint, fps[k]) {
				oc.Differs = append(oc.Differs, m.Name)
			}
			if !slices.Contains(oc.Holders, m.Name) {
				oc.Holders = append(oc.Holders, m.Name)
			}
		}
	}
	for _, oc := range byKey {
		for _, name := range read {
			if !slices.Contains(oc.Holders, name) {
				oc.Lacking = append(oc.Lacking, name)
			}
		}
		res.Objects = append(res.Objects, *oc)
	}
	slices.SortFunc(res.Objects, func(x, y objectCopies) int { return strings.Compare(x.Identity, y.Identity) })
	return res
}

// readMember opens member m (with its own PIN source) and lists its objects.
func readMember(ctx context.Context, a *app, m config.Member, set config.Settings) ([]object.Object, error) {
	pin, err := m.ReadPIN()
	if err != nil {
		return nil, err
	}
	defer pin.Zero()
	s, err := a.openSlot(ctx, report.MemberSpec(m, set, pin))
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return sync.List(ctx, s)
}

// objectsProblems counts what makes the report a problem.
func objectsProblems(res objectsResult) int {
	n := 0
	for _, m := range res.Members {
		if !m.Read {
			n++
		}
	}
	for _, o := range res.Objects {
		if len(o.Lacking) > 0 || len(o.Differs) > 0 {
			n++
		}
	}
	return n
}

// makeObjectsTable is the text table of the report.
func makeObjectsTable(res objectsResult) ([]string, [][]string) {
	rows := make([][]string, 0, len(res.Objects))
	for _, o := range res.Objects {
		rows = append(rows, []string{o.Identity, strings.Join(o.Holders, ","), dash(strings.Join(o.Lacking, ",")), dash(strings.Join(o.Differs, ","))})
	}
	return []string{"OBJECT", "HELD BY", "LACKED BY", "DIFFERS ON"}, rows
}
