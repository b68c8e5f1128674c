#!/usr/bin/env bash
# check_methods.sh KVSIEVE -- cross-checks every method of the `kvsieve` binary
# against the independent Python reference (ref_methods.py, written from the
# spec and docs/methods.md only).
#
# What it does: for several small caches (tiny preset and custom shapes; f32,
# f16 and bf16; with and without image spans; all queries or only a window) and
# several budgets and non-default parameters, runs `kvsieve synth` and
# `kvsieve compress --plan --out`, then lets the reference recompute layer
# budgets, every index set and the compacted / merged K/V. Index sets must be
# equal; a difference at a top-k cut whose reference scores agree within 1e-6
# relative is a float tie (reported, not failed). Merged K/V must agree within
# 1e-4 relative. What it does not do: check `random`'s stream (only counts and
# order), or time anything.
# Ends with "N passed, M failed"; exits non-zero on any real mismatch.
set -u
BIN=${1:?usage: check_methods.sh path/to/kvsieve}
HERE=$(cd "$(dirname "$0")" && pwd)
command -v python3 >/dev/null || { echo "check_methods.sh: python3 is required (standard library only)" >&2; exit 1; }
TMP=$(mktemp -d)
# KVS_REF_KEEP=1 keeps the dumps, plans and manifest (for re-running ref_methods.py by hand)
if [ -n "${KVS_REF_KEEP:-}" ]; then echo "keeping $TMP"; else trap 'rm -rf "$TMP"' EXIT; fi
pass=0 fail=0
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }

# name : synth arguments
cases=(
  "tiny64:--preset tiny --tokens 64 --seed 1 --image-frac 0.3 --sinks 2 --outliers 3"
  "c17img:--layers 3 --q-heads 4 --kv-heads 2 --head-dim 8 --tokens 17 --seed 2 --image-frac 0.3"
  "c64f16:--layers 3 --q-heads 4 --kv-heads 2 --head-dim 8 --tokens 64 --seed 3 --image-frac 0.25 --dtype f16"
  "c100text:--layers 3 --q-heads 4 --kv-heads 2 --head-dim 8 --tokens 100 --seed 4"
  "c100img:--layers 3 --q-heads 6 --kv-heads 3 --head-dim 8 --tokens 100 --seed 5 --image-frac 0.4 --sinks 1"
  "c48bf16:--layers 2 --q-heads 4 --kv-heads 1 --head-dim 8 --tokens 48 --seed 6 --image-frac 0.5 --dtype bf16"
  "c64win:--layers 3 --q-heads 4 --kv-heads 2 --head-dim 8 --tokens 64 --seed 7 --queries 12"
  "c33g1:--layers 2 --q-heads 2 --kv-heads 2 --head-dim 6 --tokens 33 --seed 8 --image-frac 0.3"
  "dba_clamp:@"
  "dba_wide:@"
  "meda_skew:@"
  "meda_imgfirst:@"
  "meda_audio:@"
  "c300kv:--layers 3 --q-heads 4 --kv-heads 2 --head-dim 8 --tokens 300 --seed 10 --queries none"
)
# ---- dumps with W_o and the reconstruction statistic (ref_presets_critical.py) ----
# synth --wo E / --recon: criticalkv, criticaladakv and kvzip; N 150 so SnapKV's default window 32 leaves picks
cases+=(
  "wo150:--layers 3 --q-heads 4 --kv-heads 2 --head-dim 8 --tokens 150 --seed 21 --wo 24 --recon --image-frac 0.2"
  "wo64f16:--preset tiny --tokens 64 --seed 22 --wo 12 --recon --dtype f16 --sinks 2 --outliers 5"
)
configs_wo=(
  "criticalkv:- window=8 window=8,kernel=3,pool=avg,first_stage_ratio=0.25,critical_epsilon=0.05 window=4,first_stage_ratio=0"
  "criticaladakv:- window=8 window=8,alpha=0.6,first_stage_ratio=0.75"
  "kvzip:- sinks=0 sinks=2,alpha=0.3"
)
# ---- end of the W_o / recon block ----
# "@": hand-shaped dumps written by make_dumps.py (see its header)
# method : parameter sets ("-" = defaults), separated by spaces
configs_all=(
  "full:-"
  "random:- seed=3"
  "streamingllm:- sinks=2"
  "h2o:- normalize=true recent_frac=0 recent_frac=0.3,normalize=true"
  "snapkv:- window=8,kernel=5,pool=avg window=8 window=8,kernel=4 window=8,kernel=4,pool=avg window=16,kernel=1"
  "lookm:- merge=average merge=weighted merge=none recent_frac=0.25 recent_frac=1"
  "meda:- recent_frac=0.75 merge=pivotal"
  "flashcache:- gamma=0.1 dba=false granularity=layer keep_sinks=2 keep_sinks=2,keep_recent=3 gamma=0.5,granularity=layer keep_sinks=3,keep_recent=12"
  "cake:- window=8 window=8,kernel=3,cake_gamma=0 window=4,tau1=1.6,tau2=0.4 window=16,kernel=1"
  "simlayerkv:- recent=8 recent=8,lazy_threshold=0.5 sinks=2,recent=16,lazy_threshold=0.3,window=4 recent=4,lazy_threshold=0.7"
  "qfilters:- window=0 window=4,svd_queries=16 svd_queries=1,window=2"
  "compactor:blending=0 blending=0,sinks=2,window=2,attn_chunk=16 blending=0,sinks=0,window=0,attn_chunk=7"
  "finch:- window=8 window=8,normalize_scores=false window=8,chunk_length=10 window=5,chunk_length=7"
  "think:- key_channel_ratio=0.25 window=8,key_channel_ratio=0.75,kernel=5"
)
# K and V only (no queries): the methods that need none
configs_kv=(
  "full:-"
  "random:-"
  "streamingllm:- sinks=0 sinks=1000"
  "flashcache:- gamma=0.1 dba=false granularity=layer keep_sinks=3,keep_recent=12 gamma=0.05 keep_recent=1000 keep_sinks=1000,granularity=layer"
)
# with only a window of queries: the methods that need all queries are skipped
configs_win=(
  "full:-"
  "streamingllm:-"
  "snapkv:window=8 window=12,kernel=5,pool=avg window=8,kernel=4"
  "flashcache:- dba=false"
  "cake:window=8 window=12,kernel=3"
  "simlayerkv:recent=8,lazy_threshold=0.5"
  "qfilters:window=0 window=4,svd_queries=5"
  "finch:window=12 window=8,chunk_length=9"
  "think:window=8,key_channel_ratio=0.5"
)
# --- head-adaptive and leverage presets (ref_presets_adaptive.py) ---
# leverage's Gaussian sketch is reproduced draw for draw (docs/methods.md "leverage"), its
# leverages computed in double another way: ties at the cut within 1e-5 relative
configs_all+=(
  "adakv:- window=8 window=8,alpha=0.6,kernel=4,pool=avg window=16,alpha=0 window=8,alpha=1"
  "ada_pyramidkv:- beta=2,alpha=0.5 window=4,beta=1000,alpha=1"
  "ada_flashcache:- gamma=0.05,alpha=0.6 alpha=0"
  "cur:- sinks=0,local_window=0,leverage_type=key leverage_type=value,local_window=5 leverage_type=kv_avg,sinks=1000"
  "leverage:- seed=7,sketch_dimension=200 sketch_dimension=4"
)
configs_win+=(
  "adakv:window=8 window=12,alpha=0.5,kernel=3"
  "ada_pyramidkv:- window=12,beta=2"
  "ada_flashcache:-"
  "cur:-"
  "leverage:-"
)
configs_kv+=(
  "ada_flashcache:- gamma=0.05,alpha=0.6 alpha=1"
  "cur:- local_window=0 leverage_type=kv_avg,sinks=0"
  "leverage:- sketch_dimension=200"
)
# --- end of the head-adaptive and leverage presets ---
# head-adaptive presets: their plans may be ragged (a different count per KV head)
ragged="adakv ada_pyramidkv ada_flashcache criticaladakv kvzip"
# presets of scorers and of the pyramid / chunk parts (ref_presets_scores.py);
# the key-only scorers (knorm, keydiff, lagkv) get their parameter sets on the K/V-only caches
configs_all+=(
  "knorm:-"
  "keydiff:-"
  "lagkv:lag=8"
  "tova:- window=0"
  "expected_attention:- sinks=0,use_vnorm=false use_covariance=false,sinks=2,epsilon=0.01"
  "chunkkv:- chunk=4 chunk=7,window=4,kernel=3,pool=avg"
  "pyramidkv:- window=4,beta=5,kernel=3,pool=avg window=16,beta=1.5"
  "pyramid_tova:- window=0,beta=1.5 window=4,beta=3"
)
configs_win+=(
  "tova:window=4"
  "expected_attention:-"
  "chunkkv:chunk=3,window=12"
  "pyramidkv:window=12,beta=3"
  "pyramid_tova:-"
)
configs_kv+=(
  "knorm:- sinks=4,window=4"
  "keydiff:- anchor=raw sinks=3,window=1"
  "lagkv:- lag=16 lag=32,cross_scoring=true sinks=0,lag=7 lag=5,cross_scoring=true"
)
budgets=("ratio=0.1" "ratio=0.2" "ratio=0.5" "tokens=5")
budgets_more=("ratio=0.02" "ratio=0.1" "ratio=0.2" "ratio=0.5" "ratio=0.9" "ratio=1" "tokens=1" "tokens=5" "tokens=1000")

MAN=$TMP/manifest.tsv
: >"$MAN"
job=0
for c in "${cases[@]}"; do
  name=${c%%:*}
  args=${c#*:}
  kv=$TMP/$name.safetensors
  bset=("${budgets[@]}")
  if [ "$args" = "@" ]; then
    if [ ! -f "$kv" ] && ! python3 "$HERE/make_dumps.py" "$TMP" 2>"$TMP/err"; then
      bad "make_dumps.py: $(cat "$TMP/err")"
      continue
    fi
    bset=("${budgets_more[@]}")
  else
    # shellcheck disable=SC2086
    if ! "$BIN" synth $args --out "$kv" >"$TMP/out" 2>"$TMP/err"; then
      bad "synth $name: $(cat "$TMP/err")"
      continue
    fi
  fi
  case $name in
    *win) configs=("${configs_win[@]}") ;;
    dba_wide) configs=("${configs_kv[@]}"); bset=("ratio=0.005" "ratio=0.01" "ratio=0.02" "ratio=0.05" "ratio=0.5" "ratio=0.57") ;;
    dba_*) configs=("${configs_kv[@]}") ;;
    c100text) configs=("${configs_all[@]}"); bset+=("ratio=0.29") ;;  # 0.29 * 100 = 28.999... in double
    wo*) configs=("${configs_wo[@]}"); bset+=("ratio=0.02" "ratio=0.9" "tokens=1") ;;  # the W_o / recon block above
    *kv) configs=("${configs_kv[@]}"); bset=("ratio=0.005" "ratio=0.01" "ratio=0.02" "tokens=2" "ratio=0.2") ;;
    *) configs=("${configs_all[@]}") ;;
  esac
  for mc in "${configs[@]}"; do
    method=${mc%%:*}
    for ps in ${mc#*:}; do
      pargs=()
      if [ "$ps" != "-" ]; then
        IFS=, read -ra kvs <<<"$ps"
        for p in "${kvs[@]}"; do pargs+=(--param "$p"); done
      fi
      for b in "${bset[@]}"; do
        job=$((job + 1))
        plan=$TMP/p$job.json out=$TMP/o$job.safetensors oargs=(--out "$out")
        # a ragged plan has no dump (the format is [Hkv, B, d]): its plan is checked alone
        case " $ragged " in *" $method "*) out=- oargs=() ;; esac
        # plans must not depend on the thread count: cycle through 1, 2, 3
        if "$BIN" compress --kv "$kv" --method "$method" "--${b%%=*}" "${b#*=}" "${pargs[@]}" \
             --threads $((job % 3 + 1)) --plan "$plan" "${oargs[@]}" --quiet >"$TMP/out" 2>"$TMP/err"; then
          printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$kv" "$method" "$b" "$ps" "$plan" "$out" >>"$MAN"
        else
          bad "compress $method $name $b $ps: $(cat "$TMP/err")"
        fi
      done
    done
  done
done

python3 "$HERE/ref_methods.py" "$MAN" >"$TMP/ref.out" 2>&1
rc=$?
cat "$TMP/ref.out"
summary=$(tail -n 1 "$TMP/ref.out")
if [[ $summary =~ ^reference:\ ([0-9]+)\ passed.*,\ ([0-9]+)\ failed$ ]]; then
  pass=$((pass + BASH_REMATCH[1]))
  fail=$((fail + BASH_REMATCH[2]))
else
  bad "reference did not finish (rc $rc)"
fi
[ $rc -eq 0 ] || [ $fail -gt 0 ] || bad "reference exited with $rc"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
