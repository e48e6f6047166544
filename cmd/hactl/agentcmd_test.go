package main

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/hagroup/hagroup/pkg/config"
)

// TestAgentSetCoversSchema: agent set has a flag for every key of the
// [agent] table, so a key added to the schema is settable without an
// editor (the test fails until it is).
func TestAgentSetCoversSchema(t *testing.T) {
	var keys []string
	for _, k := range agentKeys {
		keys = append(keys, k.key)
	}
	typ := reflect.TypeFor[config.Agent]()
	for i := range typ.NumField() {
		tag, _, _ := strings.Cut(typ.Field(i).Tag.Get("toml"), ",")
		if tag == "" || tag == "-" {
			continue
		}
		if !slices.Contains(keys, tag) {
			t.Errorf("[agent] key %q has no flag in hactl agent set", tag)
		}
	}
}
