package report

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html/template"
	"os"
	"path/filepath"

	"github.com/spillway-go/spillway/loadtest/scenario"
)

// WriteOutputs writes summary.json, the PNG plots and report.html (which
// embeds the plots, so it opens offline) into dir and returns the files
// written.
func WriteOutputs(dir string, s *Report) ([]string, error) {
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
	var figs []figure
	for _, name := range s.Order {
		sc := s.Scenarios[name]
		if sc.Accuracy != nil {
			if len(sc.Accuracy.Windows) > 0 {
				f := filepath.Join(dir, "accuracy-error-vs-n.png")
				if err := plotWindowErrors(sc.Accuracy.Windows, f); err != nil {
					return files, err
				}
				files = append(files, f)
				figs = append(figs, figure{Scenario: name, Title: "bucketed sliding window: decisions that differ from the exact log against N", Path: f})
			}
			continue
		}
		cmp := filepath.Join(dir, name+"-comparison.png")
		if name == "goodput" {
			cmp = filepath.Join(dir, "goodput-curves.png")
			if err := plotGoodputCurves(sc, cmp); err != nil {
				return files, err
			}
			figs = append(figs, figure{Scenario: name, Title: "goodput and Critical p99 against offered load", Path: cmp})
		} else {
			if err := plotComparison(sc, cmp); err != nil {
				return files, err
			}
			figs = append(figs, figure{Scenario: name, Title: "the configurations side by side", Path: cmp})
		}
		files = append(files, cmp)
		for _, cn := range sc.Order {
			f := filepath.Join(dir, name+"-"+cn+".png")
			if err := plotConfiguration(sc, sc.Configurations[cn], f); err != nil {
				return files, err
			}
			files = append(files, f)
			figs = append(figs, figure{Scenario: name, Title: sc.Configurations[cn].Title, Path: f})
		}
	}
	h := filepath.Join(dir, "report.html")
	if err := writeHTML(h, s, figs); err != nil {
		return files, err
	}
	return append(files, h), nil
}

type figure struct {
	Scenario, Title, Path string
	Data                  template.URL
}

var reportTmpl = template.Must(template.New("report").Funcs(template.FuncMap{
	"pct": func(f float64) float64 { return f * 100 },
}).Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>spillway load test</title>
<style>
body{font-family:system-ui,sans-serif;max-width:1000px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
td:first-child,th:first-child,td.l{text-align:left}
.PASS{color:#070;font-weight:bold}.FAIL{color:#b00;font-weight:bold}
img{max-width:100%;border:1px solid #eee;margin:.5em 0}
pre{background:#f6f6f6;padding:1em;overflow:auto}
</style></head><body>
<h1>spillway load test</h1>
<p>seed {{.S.Seed}}, {{.S.Servers}} servers, well-behaved clients retry: {{.S.Retry}}; Redis: {{.S.Redis}}; {{.S.GoVersion}}, {{.S.CPUs}} CPUs; started {{.S.Started.Format "2006-01-02 15:04:05 MST"}}</p>
<h2>Verdict</h2>
<table><tr><th>scenario</th><th>configuration</th><th>criterion</th><th>measured</th><th>result</th></tr>
{{range .S.Verdict}}<tr><td>{{.Scenario}}</td><td class="l">{{.Configuration}}</td><td class="l">{{.Criterion}}</td><td class="l">{{.Measured}}</td><td class="{{if .Expected}}info{{else if not .Pass}}FAIL{{else if .Info}}info{{else}}PASS{{end}}">{{if .Expected}}{{if .Pass}}met (shown){{else}}missed (shown){{end}}{{else if not .Pass}}FAIL{{else if .Info}}info{{else}}PASS{{end}}</td></tr>
{{end}}</table>
{{range .Scenarios}}<h2>{{.Name}}</h2>
{{if .Accuracy}}<pre>{{$.AccuracyText}}</pre>{{else}}
<table><tr><th>configuration</th><th>phase</th><th>DB capacity</th><th>offered/s (incl. retries)</th><th>admitted/s</th><th>goodput/s</th><th>backend peak</th><th>backend p99 ms</th><th>degraded/s</th><th>Critical p99 ms</th><th>Critical ok</th></tr>
{{$scn := .}}{{range $cn := .Order}}{{with index $scn.Configurations $cn}}{{range .Phases}}<tr><td>{{$cn}}</td><td class="l">{{.Name}}</td><td>{{.Capacity}}</td><td>{{printf "%.0f" .OfferedRPS}}</td><td>{{if eq $cn "none"}}–{{else}}{{printf "%.0f" .AdmittedRPS}}{{end}}</td><td>{{printf "%.0f" .GoodputRPS}}</td><td>{{printf "%.0f" .BackendPeak}}</td><td>{{if gt .BackendP99MS 0.0}}{{printf "%.0f" .BackendP99MS}}{{else}}–{{end}}</td><td>{{if eq $cn "none"}}–{{else}}{{printf "%.0f" .DegradedRPS}}{{end}}</td><td>{{if gt .CriticalP99MS 0.0}}{{printf "%.0f" .CriticalP99MS}}{{else}}–{{end}}</td><td>{{if gt .CriticalRequests 0}}{{printf "%.1f%%" (pct .CriticalSuccess)}}{{else}}–{{end}}</td></tr>
{{end}}{{end}}{{end}}</table>{{end}}
{{$sc := .Name}}{{range $.Figures}}{{if eq .Scenario $sc}}<h3>{{.Title}}</h3><img src="{{.Data}}" alt="{{.Title}}">{{end}}{{end}}
{{end}}
</body></html>
`))

func writeHTML(path string, s *Report, figs []figure) error {
	for i := range figs {
		b, err := os.ReadFile(figs[i].Path)
		if err != nil {
			return fmt.Errorf("loadtest: report: %w", err)
		}
		figs[i].Data = template.URL("data:image/png;base64," + base64.StdEncoding.EncodeToString(b))
	}
	var scs []*scenario.ScenarioResult
	var acc bytes.Buffer
	for _, name := range s.Order {
		sc := s.Scenarios[name]
		scs = append(scs, sc)
		if sc.Accuracy != nil {
			scenario.PrintAccuracy(&acc, sc.Accuracy)
		}
	}
	data := struct {
		S            *Report
		Scenarios    []*scenario.ScenarioResult
		Figures      []figure
		AccuracyText string
	}{S: s, Scenarios: scs, Figures: figs, AccuracyText: acc.String()}
	var buf bytes.Buffer
	if err := reportTmpl.Execute(&buf, data); err != nil {
		return fmt.Errorf("loadtest: report: %w", err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("loadtest: report: %w", err)
	}
	return nil
}
