package load

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"os"
	"runtime"
	"sync"
	"time"
)

// StatsLine is one line libhapkcs11.so appends to HAGROUP_STATS_FILE: the
// cumulative counters of every member of one group at one time.
type StatsLine struct {
	Time    time.Time     `json:"time"`
	PID     int           `json:"pid"`
	Group   string        `json:"group"`
	Members []StatsMember `json:"members"`
}

// StatsMember is one member's counters in a StatsLine.
type StatsMember struct {
	Name      string    `json:"name"`
	State     string    `json:"state"`
	Since     time.Time `json:"since"`
	Ops       uint64    `json:"ops"`
	Errors    uint64    `json:"errors"`
	Failovers uint64    `json:"failovers"`
	InFlight  int64     `json:"in_flight"`
}

// ReadStats reads a stats file; a torn last line (the writer is still
// appending) is ignored.
func ReadStats(path string) ([]StatsLine, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ParseStats(f)
}

// ParseStats parses stats lines from r.
func ParseStats(r io.Reader) ([]StatsLine, error) {
	var out []StatsLine
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	var pending error
	for n := 1; sc.Scan(); n++ {
		if pending != nil {
			return nil, pending // a bad line that was not the last one
		}
		var l StatsLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			pending = fmt.Errorf("stats line %d: %w", n, err)
			continue
		}
		out = append(out, l)
	}
	return out, sc.Err()
}

// Latest returns the last line of group from pid (0: any), if any.
func Latest(lines []StatsLine, group string, pid int) (StatsLine, bool) {
	for i := len(lines) - 1; i >= 0; i-- {
		if lines[i].Group == group && (pid == 0 || lines[i].PID == pid) {
			return lines[i], true
		}
	}
	return StatsLine{}, false
}

// Member returns the named member of a line.
func (l StatsLine) Member(name string) (StatsMember, bool) {
	for _, m := range l.Members {
		if m.Name == name {
			return m, true
		}
	}
	return StatsMember{}, false
}

// Point is one value of a series at a time.
type Point struct {
	At    time.Time
	Value float64
}

// Rates turns the cumulative op counters of group's lines into operations
// per second per member, averaged over windows of width w.
func Rates(lines []StatsLine, group string, w time.Duration) map[string][]Point {
	out := map[string][]Point{}
	var last StatsLine
	have := false
	for _, l := range lines {
		if l.Group != group {
			continue
		}
		if !have {
			last, have = l, true
			continue
		}
		dt := l.Time.Sub(last.Time)
		if dt < w {
			continue
		}
		for _, m := range l.Members {
			prev, _ := last.Member(m.Name)
			d := float64(m.Ops) - float64(prev.Ops)
			if d < 0 {
				d = 0
			}
			out[m.Name] = append(out[m.Name], Point{At: last.Time.Add(dt / 2), Value: d / dt.Seconds()})
		}
		last = l
	}
	return out
}

// VerifySignatures checks every record of a haload signature file (32
// data bytes, 64 signature bytes) against the P-256 public key whose
// CKA_EC_POINT is ecPoint, with Go's crypto/ecdsa: no HSM involved. haload
// signs the 32 bytes as they are (CKM_ECDSA), so they are the digest.
func VerifySignatures(path string, ecPoint []byte) (total, bad int, err error) {
	pub, err := ECPublicKey(ecPoint)
	if err != nil {
		return 0, 0, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, err
	}
	const rec = 32 + 64
	if len(b)%rec != 0 {
		return 0, 0, fmt.Errorf("%s: %d bytes is not a whole number of %d-byte records", path, len(b), rec)
	}
	n := len(b) / rec
	workers := max(runtime.GOMAXPROCS(0), 1)
	var wg sync.WaitGroup
	bads := make([]int, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				r := b[i*rec : (i+1)*rec]
				rr := new(big.Int).SetBytes(r[32:64])
				ss := new(big.Int).SetBytes(r[64:96])
				if !ecdsa.Verify(pub, r[:32], rr, ss) {
					bads[w]++
				}
			}
		}()
	}
	wg.Wait()
	for _, x := range bads {
		bad += x
	}
	return n, bad, nil
}

// ECPublicKey parses a CKA_EC_POINT (a DER OCTET STRING around an
// uncompressed P-256 point).
func ECPublicKey(ecPoint []byte) (*ecdsa.PublicKey, error) {
	if len(ecPoint) != 67 || ecPoint[0] != 0x04 || ecPoint[1] != 65 {
		return nil, fmt.Errorf("CKA_EC_POINT %x is not an OCTET STRING of a 65-byte P-256 point", ecPoint)
	}
	return ecdsa.ParseUncompressedPublicKey(elliptic.P256(), ecPoint[2:])
}
