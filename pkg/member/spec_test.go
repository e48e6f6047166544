package member

import (
	"reflect"
	"testing"
	"time"

	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/dispatch"
)

// notInSpec are the config.Member fields that do not describe how the
// token is opened, and where each goes instead.
var notInSpec = map[string]string{
	"PINFile": "read by the caller (config.Member.ReadPIN) into Spec.PIN",
	"PINEnv":  "read by the caller (config.Member.ReadPIN) into Spec.PIN",
	"Standby": "member.Config and the member's state",
}

// callerSets are the slot.Spec fields the configuration does not hold.
var callerSets = map[string]bool{
	"PIN": true, "MaxSessions": true, "Interceptor": true, "ThreadCallers": true, "StoreLock": true,
}

// filled is a config.Member with every field set to a value of its own.
func filled(t *testing.T) config.Member {
	t.Helper()
	var m config.Member
	v := reflect.ValueOf(&m).Elem()
	for i := range v.NumField() {
		f, name := v.Field(i), v.Type().Field(i).Name
		switch f.Kind() {
		case reflect.String:
			f.SetString("value-of-" + name)
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Map:
			mp := reflect.MakeMap(f.Type())
			mp.SetMapIndex(reflect.ValueOf("KEY_"+name), reflect.ValueOf("value"))
			f.Set(mp)
		case reflect.Pointer:
			p := reflect.New(f.Type().Elem())
			p.Elem().SetInt(4242)
			f.Set(p)
		default:
			t.Fatalf("config.Member.%s is a %s: give it a test value here", name, f.Kind())
		}
	}
	return m
}

// TestSlotSpecCarriesEveryField fails when config.Member gains a field
// that SlotSpec neither maps nor is told to leave out, or slot.Spec one
// that SlotSpec does not fill.
func TestSlotSpecCarriesEveryField(t *testing.T) {
	set := config.Defaults()
	set.CommandTimeout, set.KeygenTimeout = 3*time.Second, 7*time.Second
	full := filled(t)
	want := SlotSpec(full, set)

	mt := reflect.TypeFor[config.Member]()
	for i := range mt.NumField() {
		name := mt.Field(i).Name
		m := full
		reflect.ValueOf(&m).Elem().Field(i).SetZero()
		changed := !reflect.DeepEqual(SlotSpec(m, set), want)
		if why, out := notInSpec[name]; out {
			if changed {
				t.Errorf("config.Member.%s changes the slot.Spec, but the test says it is %s", name, why)
			}
			continue
		}
		if !changed {
			t.Errorf("config.Member.%s is not carried into slot.Spec by SlotSpec (or list it in notInSpec with where it goes)", name)
		}
	}

	st := reflect.TypeFor[slot.Spec]()
	got := reflect.ValueOf(want)
	for i := range st.NumField() {
		name := st.Field(i).Name
		if got.Field(i).IsZero() != callerSets[name] {
			t.Errorf("slot.Spec.%s: set by SlotSpec = %v, caller's to set = %v", name, !got.Field(i).IsZero(), callerSets[name])
		}
	}
}

// TestSlotSpecValues checks where each value lands.
func TestSlotSpecValues(t *testing.T) {
	uid := int64(1001)
	m := config.Member{
		Name: "hsm-a", Module: "/usr/lib/softhsm/libsofthsm2.so", ModuleEnv: map[string]string{"SOFTHSM2_CONF": "/etc/a.conf"},
		TokenLabel: "a", TokenSerial: "s", URI: "pkcs11:token=a", ServerUID: &uid, PINFile: "/etc/pin", Standby: true,
		Dispatch: "inline",
	}
	set := config.Defaults()
	set.CommandTimeout, set.KeygenTimeout = 3*time.Second, 7*time.Second
	got := SlotSpec(m, set)
	want := slot.Spec{
		Name: "hsm-a", Module: m.Module, ModuleEnv: m.ModuleEnv, TokenLabel: "a", TokenSerial: "s", URI: "pkcs11:token=a",
		CommandTimeout: 3 * time.Second, KeygenTimeout: 7 * time.Second, Dispatch: dispatch.Inline,
	}
	if got.ServerUID == nil || *got.ServerUID != 1001 {
		t.Fatalf("ServerUID = %v, want 1001", got.ServerUID)
	}
	got.ServerUID = nil
	if !reflect.DeepEqual(got, want) {
		t.Errorf("SlotSpec = %+v, want %+v", got, want)
	}
}
