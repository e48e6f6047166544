package main

import "testing"

func TestSlotIDs(t *testing.T) {
	tests := []struct {
		name   string
		serial string
		want   uint
	}{
		{"numeric serial is the slot ID", "1000001", 1000001},
		{"leading zeros", "0000042", 42},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := virtualSlotID(tc.serial); got != tc.want {
				t.Errorf("virtualSlotID(%q) = %d, want %d", tc.serial, got, tc.want)
			}
		})
	}
	for _, serial := range []string{"ha-prod-01", "99999999999999999999", "1073741824"} {
		id := virtualSlotID(serial)
		if id >= idSpace || id != virtualSlotID(serial) {
			t.Errorf("virtualSlotID(%q) = %#x: want a stable ID below 2^30", serial, id)
		}
	}
	a, b := physicalSlotID("1000001", "hsm-a"), physicalSlotID("1000001", "hsm-b")
	if a == b || a&physicalBit == 0 || b&physicalBit == 0 || a >= 1<<31 || b >= 1<<31 {
		t.Errorf("member slot IDs %#x, %#x: want distinct IDs with bit 30 set, below 2^31", a, b)
	}
	if physicalSlotID("1000001", "hsm-a") != a {
		t.Errorf("member slot ID is not stable")
	}
}

func TestSlotIDCollision(t *testing.T) {
	ids := slotIDs{used: map[uint]bool{}}
	first := ids.take(physicalBit | idSpaceMask)
	second := ids.take(physicalBit | idSpaceMask)
	if first == second || second&physicalBit == 0 {
		t.Errorf("a collision gave %#x then %#x: want a different ID in the same range", first, second)
	}
}
