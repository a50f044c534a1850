package main

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The repository root, from this package's directory.
const repoRoot = "../.."

// apacheLicenseSHA256 is the SHA-256 of the Apache License 2.0 as the
// Apache Software Foundation publishes it
// (https://www.apache.org/licenses/LICENSE-2.0.txt), appendix included.
const apacheLicenseSHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"

// TestLicense: LICENSE is the Apache License 2.0, whole and unedited, and
// the README says so.
func TestLicense(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "LICENSE"))
	if err != nil {
		t.Fatal(err)
	}
	if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != apacheLicenseSHA256 {
		t.Errorf("LICENSE is not the Apache License 2.0 text as published (sha256 %x)", sum)
	}
	readme, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "[Apache License, Version 2.0](LICENSE)") {
		t.Error("README.md does not say pgfence's license")
	}
}

// TestReleaseAgrees: the release CHANGELOG.md names last is the tag
// `make image` gives the image and the one the Kubernetes manifests run,
// so that what the manifests name is what the Makefile builds.
func TestReleaseAgrees(t *testing.T) {
	changelog, err := os.ReadFile(filepath.Join(repoRoot, "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^## \[([0-9]+\.[0-9]+\.[0-9]+)\] - (unreleased|[0-9]{4}-[0-9]{2}-[0-9]{2})$`).FindSubmatch(changelog)
	if m == nil {
		t.Fatal("CHANGELOG.md has no version heading like `## [0.1.0] - 2026-01-31` (or `- unreleased`)")
	}
	release := string(m[1])
	if !strings.Contains(string(changelog), "\n["+release+"]: ") {
		t.Errorf("CHANGELOG.md has no link for [%s]", release)
	}
	make := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("make", append([]string{"-C", repoRoot, "-s", "--no-print-directory"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("make %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	if got := strings.TrimSpace(make("image-tag")); got != release {
		t.Errorf("make image-tag says %q, CHANGELOG.md's newest release is %q", got, release)
	}
	// What make image would run (-n: printed, not run).
	tagged := regexp.MustCompile(`(^|\s)-t localhost/pgfence:` + regexp.QuoteMeta(release) + `\s`)
	if recipe := make("-n", "image", "IMAGE_BASES=registry"); !tagged.MatchString(recipe) {
		t.Errorf("make image does not tag localhost/pgfence:%s:\n%s", release, recipe)
	}
	manifests, err := filepath.Glob(filepath.Join(repoRoot, "deploy/kubernetes/*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	image := regexp.MustCompile(`(?m)^\s+image: \S*/pgfence:(\S+)$`)
	found := 0
	for _, f := range manifests {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range image.FindAllSubmatch(b, -1) {
			found++
			if string(m[1]) != release {
				t.Errorf("%s runs pgfence:%s, CHANGELOG.md's newest release is %s", filepath.Base(f), m[1], release)
			}
		}
	}
	if found == 0 {
		t.Error("no pgfence image found in deploy/kubernetes/*.yaml")
	}
}
