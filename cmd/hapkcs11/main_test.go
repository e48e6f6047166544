package main

import (
	"os"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
)

func TestMain(m *testing.M) { os.Exit(testhsm.Main(m, 1)) }
