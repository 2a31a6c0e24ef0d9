package persistence

import (
	"testing"

	"go.uber.org/goleak"
)

// Every Journal starts a flusher and a segment preparer; Close must end both.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
