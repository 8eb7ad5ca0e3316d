#!/bin/sh
# Answers like `vllm` just enough for the runtime tests (busybox image built by tests/harness).
# The faithful stand-in of vLLM 0.33 is the image built from containers/ (make fake-vllm-image).
# Knobs (env): FAKE_VLLM_BOOT_SECONDS, FAKE_VLLM_CRASH_AFTER_SECONDS, FAKE_VLLM_IGNORE_SIGTERM=1.
case "$1" in
  --version | -v) echo "0.33.0"; exit 0 ;;
  serve) shift ;;
  *) echo "usage: vllm serve MODEL [options]" >&2; exit 2 ;;
esac
log() { echo "(APIServer pid=$$) INFO $(date +'%m-%d %H:%M:%S') [fake_vllm.sh] $*"; }
if [ "${FAKE_VLLM_IGNORE_SIGTERM:-0}" = 1 ]; then
  trap '' TERM
else
  trap 'log "Shutting down"; exit 0' TERM INT
fi
log "vLLM server version 0.33.0, serving model ${1:-?}"
log "non-default args: $*"
log "GPU device nodes: $(ls /dev | grep nvidia | tr '\n' ' ')"
[ -n "$VLLM_API_KEY" ] && log "API key: set"
port=8000
while [ $# -gt 0 ]; do
  case "$1" in
    --port) port="$2"; shift ;;
    --port=*) port="${1#--port=}" ;;
  esac
  shift
done
sleep "${FAKE_VLLM_BOOT_SECONDS:-0}"
mkdir -p /tmp/www && echo OK > /tmp/www/health && echo '{"version": "0.33.0"}' > /tmp/www/version
httpd -p "$port" -h /tmp/www
log "Starting vLLM server on http://0.0.0.0:$port"
echo "INFO:     Application startup complete."
if [ -n "$FAKE_VLLM_CRASH_AFTER_SECONDS" ]; then
  sleep "$FAKE_VLLM_CRASH_AFTER_SECONDS"
  echo "(EngineCore pid=$$) ERROR $(date +'%m-%d %H:%M:%S') [fake_vllm.sh] EngineCore encountered a fatal error."
  exit 1
fi
while :; do sleep 1 & wait $!; done
