package fallback_test

import (
	"strings"
	"testing"
	"time"

	"github.com/spillway-go/spillway/fallback"
)

func TestHealthSettingsErrors(t *testing.T) {
	if _, err := fallback.NewHealth(nil, fallback.HealthSettings{ProbeTimeout: -time.Second}); err == nil || !strings.Contains(err.Error(), "probe timeout") {
		t.Fatalf("negative ProbeTimeout: %v; want an error naming it", err)
	}
}
