// Command promlint checks a metrics exposition the way Prometheus reads it.
//
//	promlint [FILE]   # FILE, or standard input
//
// The input is parsed with Prometheus's own scrape parsers (model/textparse):
// the OpenMetrics parser when the text ends with "# EOF", the classic text
// parser otherwise. Each family is then checked by client_golang's promlint
// (naming, units, counters ending in _total, HELP text), and every family must
// have a TYPE. Problems are printed one a line as "NAME: TEXT"; the exit
// status is 1 when there is any, 2 when the text does not parse.
package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/textparse"
	"google.golang.org/protobuf/proto"
)

func main() {
	input, err := read(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "promlint:", err)
		os.Exit(2)
	}
	families, problems, err := parse(input)
	if err != nil {
		fmt.Fprintln(os.Stderr, "promlint: parsing:", err)
		os.Exit(2)
	}
	lint, err := promlint.NewWithMetricFamilies(families).Lint()
	if err != nil {
		fmt.Fprintln(os.Stderr, "promlint: linting:", err)
		os.Exit(2)
	}
	for _, p := range lint {
		problems = append(problems, p.Metric+": "+p.Text)
	}
	for _, p := range problems {
		fmt.Println(p)
	}
	fmt.Fprintf(os.Stderr, "promlint: %d families, %d problems\n", len(families), len(problems))
	if len(problems) > 0 {
		os.Exit(1)
	}
}

func read(args []string) ([]byte, error) {
	switch len(args) {
	case 0:
		return io.ReadAll(os.Stdin)
	case 1:
		return os.ReadFile(args[0])
	default:
		return nil, errors.New("usage: promlint [FILE]")
	}
}

// family is one metric family as the parser saw it.
type family struct {
	name  string
	typ   model.MetricType
	typed bool
	help  string
	mf    *dto.MetricFamily
	// histograms holds a histogram family's series by their labels.
	histograms map[string]*dto.Metric
}

// parse reads every entry, groups series into families and returns them as
// client_model families (named as the classic text format names them:
// counters with _total, info metrics with _info), with problems promlint does
// not look for.
func parse(input []byte) ([]*dto.MetricFamily, []string, error) {
	openMetrics := bytes.HasSuffix(bytes.TrimRight(input, "\n"), []byte("# EOF"))
	st := labels.NewSymbolTable()
	var p textparse.Parser
	if openMetrics {
		p = textparse.NewOpenMetricsParser(input, st)
	} else {
		p = textparse.NewPromParser(input, st, false)
	}
	byName := map[string]*family{}
	var order []*family
	get := func(name string) *family {
		f, ok := byName[name]
		if !ok {
			f = &family{name: name, typ: model.MetricTypeUnknown}
			byName[name] = f
			order = append(order, f)
		}
		return f
	}
	var problems []string
	for {
		entry, err := p.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, err
		}
		switch entry {
		case textparse.EntryType:
			name, typ := p.Type()
			f := get(string(name))
			f.typ, f.typed = typ, true
		case textparse.EntryHelp:
			name, help := p.Help()
			get(string(name)).help = string(help)
		case textparse.EntrySeries:
			var ls labels.Labels
			p.Labels(&ls)
			_, _, value := p.Series()
			name := ls.Get(labels.MetricName)
			f := byName[familyName(name, byName)]
			if f == nil {
				f = get(name)
			}
			if err := f.add(name, ls, value, openMetrics); err != nil {
				problems = append(problems, err.Error())
			}
		case textparse.EntryHistogram:
			return nil, nil, errors.New("native histograms are not supported by this checker")
		}
	}
	var families []*dto.MetricFamily
	for _, f := range order {
		if f.mf == nil {
			continue
		}
		if !f.typed {
			problems = append(problems, f.mf.GetName()+": no TYPE")
		}
		if f.help != "" {
			f.mf.Help = proto.String(f.help)
		}
		families = append(families, f.mf)
	}
	sort.Strings(problems)
	return families, problems, nil
}

// familyName finds the family a series belongs to: its own name, or its
// name without a suffix its family's type gives it.
func familyName(series string, byName map[string]*family) string {
	if _, ok := byName[series]; ok {
		return series
	}
	for _, suffix := range []string{"_total", "_created", "_info", "_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(series, suffix); ok {
			if _, known := byName[base]; known {
				return base
			}
		}
	}
	return series
}

// add records one sample in the family.
func (f *family) add(series string, ls labels.Labels, value float64, openMetrics bool) error {
	var typ dto.MetricType
	name := series
	switch f.typ {
	case model.MetricTypeCounter:
		typ = dto.MetricType_COUNTER
		if strings.HasSuffix(series, "_created") {
			return nil
		}
		if openMetrics && series != f.name+"_total" {
			return fmt.Errorf("%s: a sample of counter %s must be named %s_total", series, f.name, f.name)
		}
	case model.MetricTypeGauge, model.MetricTypeStateset:
		typ = dto.MetricType_GAUGE
	case model.MetricTypeInfo:
		typ = dto.MetricType_GAUGE
	case model.MetricTypeUnknown:
		typ = dto.MetricType_UNTYPED
	case model.MetricTypeHistogram:
		return f.addHistogram(series, ls, value)
	default:
		return fmt.Errorf("%s: type %s is not supported by this checker", series, f.typ)
	}
	if f.mf == nil {
		f.mf = &dto.MetricFamily{Name: proto.String(name), Type: typ.Enum()}
	}
	m := &dto.Metric{}
	ls.Range(func(l labels.Label) {
		if l.Name != labels.MetricName {
			m.Label = append(m.Label, &dto.LabelPair{Name: proto.String(l.Name), Value: proto.String(l.Value)})
		}
	})
	switch typ {
	case dto.MetricType_COUNTER:
		m.Counter = &dto.Counter{Value: proto.Float64(value)}
	case dto.MetricType_GAUGE:
		m.Gauge = &dto.Gauge{Value: proto.Float64(value)}
	default:
		m.Untyped = &dto.Untyped{Value: proto.Float64(value)}
	}
	f.mf.Metric = append(f.mf.Metric, m)
	return nil
}

// addHistogram records one sample of a classic histogram: a bucket (with
// its le label), the sum or the count of the series its other labels name.
func (f *family) addHistogram(series string, ls labels.Labels, value float64) error {
	if f.mf == nil {
		f.mf = &dto.MetricFamily{Name: proto.String(f.name), Type: dto.MetricType_HISTOGRAM.Enum()}
		f.histograms = map[string]*dto.Metric{}
	}
	var le string
	b := labels.NewBuilder(ls).Del(labels.MetricName, "le")
	if ls.Has("le") {
		le = ls.Get("le")
	}
	rest := b.Labels()
	id := rest.String()
	m, ok := f.histograms[id]
	if !ok {
		m = &dto.Metric{Histogram: &dto.Histogram{}}
		rest.Range(func(l labels.Label) {
			m.Label = append(m.Label, &dto.LabelPair{Name: proto.String(l.Name), Value: proto.String(l.Value)})
		})
		f.histograms[id] = m
		f.mf.Metric = append(f.mf.Metric, m)
	}
	switch series {
	case f.name + "_bucket":
		if le == "" {
			return fmt.Errorf("%s: a histogram bucket without an le label", series)
		}
		bound, err := strconv.ParseFloat(le, 64)
		if err != nil {
			return fmt.Errorf("%s: le=%q is not a number", series, le)
		}
		m.Histogram.Bucket = append(m.Histogram.Bucket, &dto.Bucket{
			UpperBound:      proto.Float64(bound),
			CumulativeCount: proto.Uint64(uint64(value)),
		})
	case f.name + "_sum":
		m.Histogram.SampleSum = proto.Float64(value)
	case f.name + "_count":
		m.Histogram.SampleCount = proto.Uint64(uint64(value))
	case f.name + "_created":
	default:
		return fmt.Errorf("%s: not a sample of histogram %s", series, f.name)
	}
	return nil
}
