package group

import "testing"

// Example names the last three pool tokens by label (tok-187 …).
func TestExampleTokensAreReserved(t *testing.T) {
	if poolSize-3 != 187 {
		t.Fatalf("Example uses tok-187…189 but the pool has %d tokens", poolSize)
	}
}
