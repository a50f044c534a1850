package leasetest

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// A missing server is an error naming the install script, never a skip.
func TestMissingServerNamesInstallScript(t *testing.T) {
	ctx := context.Background()
	_, err := StartEtcd(ctx, EtcdOptions{Bin: "/nonexistent/etcd"})
	if !errors.Is(err, ErrNotInstalled) || !strings.Contains(err.Error(), "scripts/install-lease-deps.sh") {
		t.Errorf("etcd missing: %v", err)
	}
	_, err = StartZooKeeper(ctx, ZooKeeperOptions{Jar: "/nonexistent/zookeeper.jar"})
	if !errors.Is(err, ErrNotInstalled) || !strings.Contains(err.Error(), "scripts/install-lease-deps.sh") {
		t.Errorf("zookeeper missing: %v", err)
	}
	_, err = StartZooKeeper(ctx, ZooKeeperOptions{Java: "/nonexistent/java"})
	if !errors.Is(err, ErrNotInstalled) || !strings.Contains(err.Error(), "scripts/install-lease-deps.sh") {
		t.Errorf("java missing: %v", err)
	}
	t.Log(err)
}
