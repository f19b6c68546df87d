#!/bin/sh
# Mount cgroup v1's cpu, cpuacct and cpuset hierarchies (and blkio where the kernel frees io) on
# a machine that has only cgroup v2, as the lent GPU machines do: `adloader bench`, and so the
# node part of `python -m bench.gpu`, drive the controller's cgroup-v1 backend. Run as root on
# a throwaway machine only: it takes cpu, cpuset and io away from every cgroup v2 group and
# hides the v2 mount under a tmpfs. Does nothing where cgroup v1's cpu hierarchy is mounted.
set -eu
root=${1:-/sys/fs/cgroup}
if [ -w "$root/cpu/cpu.cfs_quota_us" ]; then
    echo "cgroup_v1_beside_v2: cgroup v1 cpu is already mounted at $root/cpu"
    exit 0
fi
if [ ! -f "$root/cgroup.controllers" ]; then
    echo "cgroup_v1_beside_v2: $root is neither cgroup v1 nor cgroup v2: nothing to do here" >&2
    exit 1
fi
# a controller leaves v2 once no group enables it for its children: the deepest groups first
find "$root" -name cgroup.subtree_control | awk -F/ '{print NF "\t" $0}' | sort -rn | cut -f2- |
while read -r control; do
    for name in cpu cpuset io; do
        if grep -qw "$name" "$control"; then echo "-$name" > "$control" || echo "  could not turn $name off in $control" >&2; fi
    done
done
mount -t tmpfs -o mode=0755 cgroup-v1 "$root"
mount_v1() {  # the kernel frees a controller a moment after the last group lets it go
    mkdir -p "$root/$1"
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        if mount -t cgroup -o "$1" cgroup "$root/$1" 2>/dev/null; then echo "  mounted $1"; return 0; fi
        sleep 1
    done
    rmdir "$root/$1"  # no plain directory left where the harness looks for a hierarchy
    echo "  could not mount $1 (still bound to cgroup v2)" >&2
    return 1
}
mount_v1 cpu
mount_v1 cpuacct
mount_v1 cpuset
mount_v1 blkio || echo "cgroup_v1_beside_v2: no blkio: the controller runs without read throttles"
echo "cgroup_v1_beside_v2: cgroup v1 mounted at $root (cpu, cpuacct, cpuset$([ -d "$root/blkio" ] && echo ', blkio'))"
