package install

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/hagroup/hagroup/pkg/config"
)

// configKeys walks the TOML schema of pkg/config and returns every key as
// table.key ("agent.socket", "group.member.pin_file"); the [ha] keys a
// [[group]] may repeat inline are listed once, under ha.
func configKeys(t reflect.Type, table string, seen map[reflect.Type]bool) []string {
	var keys []string
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		if f.Anonymous { // Group embeds HA: the same keys, documented under [ha]
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if name == "-" || name == "" {
			continue
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice {
			ft = ft.Elem()
		}
		path := strings.TrimPrefix(table+"."+name, ".")
		if ft.Kind() == reflect.Struct && ft != reflect.TypeFor[config.Duration]() && !seen[ft] {
			seen[ft] = true
			keys = append(keys, configKeys(ft, path, seen)...)
			continue
		}
		keys = append(keys, path)
	}
	return keys
}

// manKeys returns the keys hagroup.toml(5) documents: each ".TP" item whose
// tag is ".B key", under the ".SH [table]" it sits in.
func manKeys(t *testing.T, page string) []string {
	t.Helper()
	var keys []string
	table := ""
	lines := strings.Split(page, "\n")
	for i, l := range lines {
		if s, ok := strings.CutPrefix(l, ".SH "); ok {
			table = ""
			if strings.HasPrefix(s, "[") {
				table = strings.Trim(s, "[]")
			}
			continue
		}
		if l != ".TP" || table == "" || i+1 == len(lines) {
			continue
		}
		if key, ok := strings.CutPrefix(lines[i+1], ".B "); ok {
			keys = append(keys, table+"."+key)
		}
	}
	return keys
}

// TestManPageDocumentsEveryConfigKey: every key pkg/config decodes has its
// item in hagroup.toml(5), under its table, and the page documents no key
// the schema lacks.
func TestManPageDocumentsEveryConfigKey(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "man", "hagroup.toml.5"))
	if err != nil {
		t.Fatal(err)
	}
	schema := configKeys(reflect.TypeFor[config.Config](), "", map[reflect.Type]bool{})
	documented := manKeys(t, string(data))
	if len(schema) < 20 {
		t.Fatalf("the schema walk found only %d keys: %q", len(schema), schema)
	}
	for _, k := range schema {
		if !slices.Contains(documented, k) {
			t.Errorf("man/hagroup.toml.5 does not document %s (add a .TP/.B item under its .SH [table])", k)
		}
	}
	for _, k := range documented {
		if !slices.Contains(schema, k) {
			t.Errorf("man/hagroup.toml.5 documents %s, which pkg/config does not decode", k)
		}
	}
}
