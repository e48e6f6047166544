package main

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"sync"

	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// newLibrary reads the configuration and builds the slot list: every group
// as a virtual slot, then (unless the group says only = true) every
// member's own token.
func newLibrary() (*library, error) {
	path := config.ResolvePath("")
	cfg, err := config.Load(path)
	if err != nil {
		log := newEventLog("", "")
		log.debug("cannot load the configuration", "path", path, "err", err)
		return nil, ckErr(pkcs11.CKR_GENERAL_ERROR)
	}
	agent := cfg.Agent.WithDefaults()
	log := newEventLog(agent.LogFile, agent.Socket)
	ctx, cancel := context.WithCancel(context.Background())
	l := &library{
		ctx:      ctx,
		cancel:   cancel,
		log:      log,
		byID:     map[uint]*slotEntry{},
		sessions: map[uint]*appSession{},
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

	// Members' own tokens, opened in parallel: one that is down costs one
	// command timeout at most, not one per member.
	type job struct {
		group, member string
		spec          slot.Spec
		tok           *physical
	}
	var jobs []*job
	for gi := range cfg.Groups {
		g := &cfg.Groups[gi]
		set := cfg.Settings(g)
		if set.Only {
			continue
		}
		for _, m := range g.Members {
			jobs = append(jobs, &job{group: g.Label, member: m.Name, spec: memberSpec(m, set)})
		}
	}
	var wg sync.WaitGroup
	for _, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A panic here would not reach call()'s recover and would kill
			// the application.
			defer func() {
				if r := recover(); r != nil {
					j.tok = &physical{group: j.group, member: j.member, err: fmt.Errorf("opening member %s: panic: %v", j.member, r)}
				}
			}()
			octx, ocancel := context.WithTimeout(ctx, j.spec.CommandTimeout)
			defer ocancel()
			j.tok = openPhysical(octx, j.group, j.spec)
		}()
	}
	wg.Wait()
	for gi, g := range cfg.Groups {
		for _, j := range jobs {
			if j.group != g.Label {
				continue
			}
			if j.tok.err != nil {
				log.event(g.Label, j.member, "member_slot_absent", j.tok.err.Error())
			}
			l.add(ids.take(physicalSlotID(cfg.Groups[gi].Serial, j.member)), j.tok)
		}
	}
	// No start line: hactl hagroup clients lists the processes.
	log.debug("started", "config", cfg.Path, "groups", len(cfg.Groups), "slots", len(l.slots))
	return l, nil
}

func (l *library) add(id uint, t token) {
	e := &slotEntry{id: id, tok: t, user: userNone}
	l.slots = append(l.slots, e)
	l.byID[id] = e
	if lo, ok := t.(sessionLoser); ok {
		lo.OnLost(func() { l.dropLost(e) })
	}
}

// memberSpec is how a member's token is opened (no PIN: the application
// logs in).
func memberSpec(m config.Member, set config.Settings) slot.Spec {
	return slot.Spec{
		Name:           m.Name,
		Module:         m.Module,
		ModuleEnv:      m.ModuleEnv,
		TokenLabel:     m.TokenLabel,
		TokenSerial:    m.TokenSerial,
		URI:            m.URI,
		ServerUID:      m.ExpectedServerUID(),
		CommandTimeout: set.CommandTimeout,
		KeygenTimeout:  set.KeygenTimeout,
		SpinHandoff:    true, // the callers are the application's threads
	}
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
