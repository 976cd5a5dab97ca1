// Command mcv-extract reads a kernel cache image from a registry the way
// MCV and GKM's extractor do, with the libraries they use (the registry
// client github.com/google/go-containerregistry at the version MCV pins,
// Go's compress/gzip, archive/tar and encoding/json), and writes what they
// would extract. It exists so gkm's tests can show that images gkm builds
// are read by that stack; it follows MCV's published format
// (mcv/docs/spec-compat.md), it is not MCV's code.
//
//	mcv-extract [-insecure] IMAGE OUT_DIR
//
// OUT_DIR/cache receives the cache tree, OUT_DIR/manifest.json the
// manifest. The last line of output is a JSON report. Any rule the image
// breaks exits 1 with a message naming it.
package main

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// target is one element of a summary label, with the types MCV reads.
type target struct {
	Backend     string `json:"backend"`
	Arch        string `json:"arch"`
	WarpSize    int    `json:"warp_size"`
	PTXVersion  int    `json:"ptx_version,omitempty"`
	CUDAVersion string `json:"cuda_version,omitempty"`
}

type summary struct {
	Targets []target `json:"targets"`
}

// kernel is one manifest entry, with the types MCV reads.
type kernel struct {
	Hash       string `json:"hash"`
	DummyKey   string `json:"dummy_key,omitempty"`
	PtxVersion int    `json:"ptx_version,omitempty"`
	NumStages  int    `json:"num_stages,omitempty"`
	NumWarps   int    `json:"num_warps,omitempty"`
	Debug      bool   `json:"debug,omitempty"`
	Backend    string `json:"backend"`
	Arch       any    `json:"arch"`
	WarpSize   int    `json:"warp_size"`
}

type binaryRecord struct {
	Rank            string         `json:"rank"`
	Prefix          string         `json:"prefix"`
	ArtifactCount   int            `json:"artifact_count"`
	ArtifactNames   []string       `json:"artifact_names,omitempty"`
	CodeHash        string         `json:"code_hash,omitempty"`
	ConfigHash      string         `json:"config_hash,omitempty"`
	CompilerHash    string         `json:"compiler_hash,omitempty"`
	CacheSaveFormat string         `json:"cache_save_format,omitempty"`
	TargetDevice    string         `json:"target_device,omitempty"`
	Env             map[string]any `json:"env,omitempty"`
}

type aotRecord struct {
	Hash      string `json:"hash"`
	Rank      string `json:"rank"`
	ModelFile string `json:"model_file"`
	FileSize  int64  `json:"file_size"`
}

type vllmGroup struct {
	VllmHash    string         `json:"vllmHash"`
	CacheFormat string         `json:"cacheFormat"`
	Triton      []kernel       `json:"triton,omitempty"`
	Binary      []binaryRecord `json:"binary,omitempty"`
	AOTCompile  []aotRecord    `json:"aot_compile,omitempty"`
}

type manifest struct {
	Triton []kernel    `json:"triton,omitempty"`
	VLLM   []vllmGroup `json:"vllm,omitempty"`
}

type report struct {
	Kind        string            `json:"kind"`
	Layers      int               `json:"layers"`
	CacheBytes  int64             `json:"cache_bytes"`
	Files       int               `json:"files"`
	Kernels     int               `json:"kernels"`
	Records     int               `json:"records"`
	Targets     []target          `json:"targets"`
	Labels      map[string]string `json:"labels"`
	LayerTypes  []string          `json:"layer_types"`
	HasManifest bool              `json:"has_manifest"`
}

func main() {
	insecure := flag.Bool("insecure", false, "plain HTTP to the registry")
	flag.Parse()
	if flag.NArg() != 2 {
		fmt.Fprintln(os.Stderr, "usage: mcv-extract [-insecure] IMAGE OUT_DIR")
		os.Exit(2)
	}
	if err := run(flag.Arg(0), flag.Arg(1), *insecure); err != nil {
		fmt.Fprintln(os.Stderr, "mcv-extract:", err)
		os.Exit(1)
	}
}

func run(image, out string, insecure bool) error {
	var opts []name.Option
	if insecure {
		opts = append(opts, name.Insecure)
	}
	ref, err := name.ParseReference(image, opts...)
	if err != nil {
		return fmt.Errorf("reference: %w", err)
	}
	img, err := remote.Image(ref)
	if err != nil {
		return fmt.Errorf("fetching the image: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("image config: %w", err)
	}
	labels := cfg.Config.Labels
	rep := report{Labels: labels}

	// The cache type comes from the summary label.
	var cachePrefix, manifestPrefix string
	switch {
	case labels["cache.triton.image/summary"] != "":
		rep.Kind, cachePrefix, manifestPrefix = "triton", "io.triton.cache/", "io.triton.manifest/"
	case labels["cache.vllm.image/summary"] != "":
		rep.Kind, cachePrefix, manifestPrefix = "vllm", "io.vllm.cache", "io.vllm.manifest/"
	default:
		return errors.New("no cache.triton.image/summary or cache.vllm.image/summary label")
	}

	var sum summary
	if err := json.Unmarshal([]byte(labels["cache."+rep.Kind+".image/summary"]), &sum); err != nil {
		return fmt.Errorf("summary label: %w", err)
	}
	rep.Targets = sum.Targets

	layers, err := img.Layers()
	if err != nil {
		return fmt.Errorf("layers: %w", err)
	}
	rep.Layers = len(layers)
	cacheDir := filepath.Join(out, "cache")
	manifestPath := filepath.Join(out, "manifest.json")
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return err
	}
	compat := 0
	for _, layer := range layers {
		mt, err := layer.MediaType()
		if err != nil {
			return fmt.Errorf("layer media type: %w", err)
		}
		rep.LayerTypes = append(rep.LayerTypes, string(mt))
		if mt != types.DockerLayer && mt != types.OCILayer {
			continue
		}
		compat++
		rc, err := layer.Compressed()
		if err != nil {
			return fmt.Errorf("layer content: %w", err)
		}
		err = unpack(rc, cachePrefix, manifestPrefix, cacheDir, manifestPath, &rep)
		rc.Close()
		if err != nil {
			return err
		}
	}
	if compat == 0 {
		return fmt.Errorf("no gzip layer (%s or %s) among %v", types.DockerLayer, types.OCILayer, rep.LayerTypes)
	}

	sizeLabel := "cache." + rep.Kind + ".image/cache-size-bytes"
	want, err := strconv.ParseInt(labels[sizeLabel], 10, 64)
	if err != nil {
		return fmt.Errorf("%s: %w", sizeLabel, err)
	}
	if want != rep.CacheBytes {
		return fmt.Errorf("%s says %d bytes, the layer holds %d", sizeLabel, want, rep.CacheBytes)
	}

	if rep.HasManifest {
		data, err := os.ReadFile(manifestPath)
		if err != nil {
			return err
		}
		var m manifest
		if err := json.Unmarshal(data, &m); err != nil {
			return fmt.Errorf("manifest.json: %w", err)
		}
		rep.Kernels = len(m.Triton)
		for _, g := range m.VLLM {
			rep.Kernels += len(g.Triton)
			rep.Records += len(g.Binary) + len(g.AOTCompile)
		}
	}
	line, err := json.Marshal(rep)
	if err != nil {
		return err
	}
	fmt.Println(string(line))
	return nil
}

// unpack reads one gzip layer: the cache below cachePrefix into cacheDir,
// the manifest into manifestPath; everything else is skipped.
func unpack(r io.Reader, cachePrefix, manifestPrefix, cacheDir, manifestPath string, rep *report) error {
	gz, err := gzip.NewReader(r)
	if err != nil {
		return fmt.Errorf("layer is not gzip: %w", err)
	}
	defer gz.Close()
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading the layer's tar: %w", err)
		}
		var dest string
		isCache := false
		switch {
		case strings.HasPrefix(h.Name, cachePrefix):
			rel := strings.TrimPrefix(h.Name, cachePrefix)
			if strings.Trim(rel, "/") == "" {
				continue
			}
			dest = filepath.Join(cacheDir, rel)
			isCache = true
		case strings.HasPrefix(h.Name, manifestPrefix+"manifest.json"):
			dest = manifestPath
			rep.HasManifest = true
		default:
			continue
		}
		if !strings.HasPrefix(filepath.Clean(dest), filepath.Clean(filepath.Dir(manifestPath))) {
			return fmt.Errorf("%s leaves the output directory", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(dest, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(dest, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o777)
			if err != nil {
				return err
			}
			n, err := io.Copy(f, tr)
			f.Close()
			if err != nil {
				return err
			}
			if isCache {
				rep.CacheBytes += n
				rep.Files++
			}
		default:
			return fmt.Errorf("%s: tar entry type %q would be skipped", h.Name, h.Typeflag)
		}
	}
}
