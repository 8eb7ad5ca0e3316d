#!/usr/bin/env bash
# There (the GPU test machine, as root, from the repo root with .pod carried: `bash
# ../shared/real-podman/fetch-debs.sh` writes it here): unpack Debian 12's Podman 4.3.1 into /opt/pod,
# make it findable, configure it for this machine, and write a CDI spec for the real GPUs (by index
# and by UUID, as `nvidia-ctk cdi generate` does). Prints the PATH and XTABLES_LIBDIR to export.
set -eu
P=/opt/pod
mkdir -p $P
for f in .pod/*.deb; do dpkg -x "$f" $P; done
# Debian's libraries last in the search path: the machine's own (newer) ones win.
printf '%s\n' $P/usr/lib/x86_64-linux-gnu $P/lib/x86_64-linux-gnu > /etc/ld.so.conf.d/zz-pod.conf
ldconfig
# dpkg -x makes no alternatives: the legacy iptables backend works here.
for n in iptables ip6tables iptables-save iptables-restore ip6tables-save ip6tables-restore; do
  ln -sf xtables-legacy-multi $P/usr/sbin/$n
done
# conmon runs `podman container cleanup` with the default PATH when a container dies: the CNI
# plugins it calls must find iptables there, or the dead container's port forward stays and the
# replacement's published port answers nothing (seen on the H200, 2026-12-01). So put iptables
# where a real install has it, unless the machine has its own.
for n in iptables ip6tables iptables-save iptables-restore ip6tables-save ip6tables-restore xtables-legacy-multi; do
  [ -e /usr/sbin/$n ] || ln -s $P/usr/sbin/$n /usr/sbin/$n
done
[ -e /usr/lib/x86_64-linux-gnu/xtables ] || ln -s $P/usr/lib/x86_64-linux-gnu/xtables /usr/lib/x86_64-linux-gnu/xtables
mkdir -p /etc/containers /etc/cdi /var/lib/containers /run/containers
cp -n $P/etc/containers/policy.json $P/etc/containers/registries.conf /etc/containers/ 2>/dev/null || true
# runc refuses Podman's default rlimits here (EPERM): nofile at most the host's 20000, nproc at most
# 16384 (16384 worked, 65536 and above failed, 2026-12-01).
cat > /etc/containers/containers.conf <<CONF
[engine]
conmon_path = ["$P/usr/bin/conmon"]
helper_binaries_dir = ["$P/usr/lib/podman", "$P/usr/libexec/podman"]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
[engine.runtimes]
runc = ["$P/usr/sbin/runc"]
[network]
cni_plugin_dirs = ["$P/usr/lib/cni"]
[containers]
log_driver = "k8s-file"
default_ulimits = ["nofile=20000:20000", "nproc=16384:16384"]
CONF
# A CDI spec like `nvidia-ctk cdi generate` writes, by index and by UUID (nvidia-ctk is not here).
{
  echo 'cdiVersion: "0.5.0"'; echo 'kind: nvidia.com/gpu'; echo 'devices:'
  nvidia-smi --query-gpu=index,uuid --format=csv,noheader | while IFS=', ' read -r i u; do
    for name in "$i" "$u"; do
      echo "- name: \"$name\""; echo "  containerEdits:"; echo "    deviceNodes: [{path: /dev/nvidia$i}]"
    done
  done
  echo 'containerEdits:'
  echo '  env: ["LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/nvidia/lib"]'
  echo '  deviceNodes: [{path: /dev/nvidiactl}, {path: /dev/nvidia-uvm}, {path: /dev/nvidia-uvm-tools}]'
  echo '  mounts:'
  echo '  - {hostPath: /usr/local/nvidia, containerPath: /usr/local/nvidia, options: [ro, nosuid, nodev, bind]}'
} > /etc/cdi/nvidia.yaml
echo "export PATH=$P/usr/bin:$P/usr/sbin:\$PATH XTABLES_LIBDIR=$P/usr/lib/x86_64-linux-gnu/xtables"
