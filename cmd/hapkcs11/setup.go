package main

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"

	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/miekg/pkcs11"
)

// errUseHelper: the configuration asks for the engine in a helper
// (library.process = "helper"), and this process is not one.
var errUseHelper = errors.New("library.process is helper")

// newLibrary reads the configuration and builds the slot list: every group
// as a virtual slot, then (unless the group says only = true) every
// member's own token, opened when it is first used (lazyPhysical). In a
// helper (serving) it runs the engine whatever library.process says.
func newLibrary(serving bool) (*library, error) {
	path := config.ResolvePath("")
	cfg, err := config.Load(path)
	if err != nil {
		log := newEventLog("", "")
		log.debug("cannot load the configuration", "path", path, "err", err)
		return nil, ckErr(pkcs11.CKR_GENERAL_ERROR)
	}
	if cfg.Library.Process == config.ProcessHelper && !serving {
		return nil, errUseHelper
	}
	agent := cfg.Agent.WithDefaults()
	log := newEventLog(agent.LogFile, agent.Socket)
	ctx, cancel := context.WithCancel(context.Background())
	l := &library{
		ctx:       ctx,
		cancel:    cancel,
		log:       log,
		byID:      map[uint]*slotEntry{},
		sessions:  map[uint]*appSession{},
		callBound: callBound(cfg),
	}
	ids := slotIDs{used: map[uint]bool{}}

	virt, closer, err := openGroups(ctx, cfg, log)
	if err != nil {
		cancel()
		log.event("", "", "start_failed", err.Error())
		log.close()
		return nil, ckErr(pkcs11.CKR_GENERAL_ERROR)
	}
	stopWatch := watchConfig(ctx, cfg.Path, virt, log) // reload.go: follow membership changes
	l.closer = func() error { stopWatch(); return closer() }
	for i, g := range cfg.Groups {
		l.add(ids.take(virtualSlotID(g.Serial)), virt[i])
	}
	for i := range cfg.Groups {
		g := &cfg.Groups[i]
		set := cfg.Settings(g)
		if set.Only {
			continue
		}
		eng := virt[i].(*virtual).g
		for _, m := range g.Members {
			p := &lazyPhysical{group: g.Label, member: m.Name, spec: member.SlotSpec(m, set), log: log}
			if gm, ok := eng.Member(m.Name); ok && gm.Slot() != nil {
				p.present = true
			} else if ok {
				err, _ := gm.LastError()
				log.event(g.Label, m.Name, "member_slot_absent", fmt.Sprint(err))
			}
			l.add(ids.take(physicalSlotID(g.Serial, m.Name)), p)
		}
	}
	// No start line: hactl hagroup clients lists the processes.
	log.debug("started", "config", cfg.Path, "groups", len(cfg.Groups), "slots", len(l.slots))
	return l, nil
}

func (l *library) add(id uint, t token) {
	e := &slotEntry{id: id, tok: t}
	l.slots = append(l.slots, e)
	l.byID[id] = e
}

// Slot IDs are stable across processes and configuration edits that do
// not touch the group: a virtual slot's ID comes from the group's serial
// (the serial itself when it is a number below 2^30, which is what
// creategroup assigns), a member's from the group serial and member name,
// with bit 30 set. IDs stay below 2^31 for applications (Java's SunPKCS11)
// that read the slot as an int.
const (
	idSpace      = 1 << 30
	physicalBit  = 1 << 30
	idSpaceMask  = idSpace - 1
	maxIDAttempt = 1 << 10
)

func virtualSlotID(serial string) uint {
	if n, err := strconv.ParseUint(serial, 10, 64); err == nil && n < idSpace {
		return uint(n)
	}
	return uint(hash32("group:"+serial)) & idSpaceMask
}

func physicalSlotID(groupSerial, member string) uint {
	return physicalBit | uint(hash32("member:"+groupSerial+"/"+member))&idSpaceMask
}

func hash32(s string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(s))
	return h.Sum32()
}

// slotIDs hands out IDs, moving a (rare) collision to the next free ID in
// configuration order.
type slotIDs struct{ used map[uint]bool }

func (s slotIDs) take(id uint) uint {
	for i := 0; i < maxIDAttempt && s.used[id]; i++ {
		id = id&^idSpaceMask | (id+1)&idSpaceMask
	}
	s.used[id] = true
	return id
}
