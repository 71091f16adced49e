#!/usr/bin/env bash
# Times the tokenizer package against Hugging Face's tokenizers (Rust, as
# Node bindings) on the same corpus (tokenizer/testdata/corpus) in the same
# run, one thread each, and prints tokens/s for both and their ratio.
#
#   scripts/bench-tokenize.sh [FAMILY...]   (default: every family)
#
# Needs what scripts/setup-test-deps.sh installs. BENCHTIME (default 3s)
# sets how long each side runs per family.
set -euo pipefail
cd "$(dirname "$0")/.."
families=("$@")
if [ ${#families[@]} -eq 0 ]; then
	families=(llama3 qwen3 deepseek_v3 gptoss gpt4o gpt35turbo claude llama2 gemma3 gemini)
fi
benchtime=${BENCHTIME:-3s}
# Family by family, Go then Node, so that both sides of a ratio see the
# same machine: these machines are shared, and their load drifts.
printf '%-12s %14s %14s %8s %10s\n' family kvfast_tok/s hf_tok/s ratio allocs/op
for f in "${families[@]}"; do
	line=$(GOMAXPROCS=1 go test -run '^$' -bench "^BenchmarkTokenize/$f\$" -benchtime "$benchtime" -benchmem ./tokenizer | grep '^Benchmark')
	echo "$line" >&2
	hf_out=$(cd tokenizer/testdata/reference && BENCH_SECONDS=${benchtime%s} node bench.mjs "$f")
	go_tps=$(echo "$line" | awk '{for (i=1;i<=NF;i++) if ($i=="tokens/s") print $(i-1)}')
	allocs=$(echo "$line" | awk '{for (i=1;i<=NF;i++) if ($i=="allocs/op") print $(i-1)}')
	hf_tps=$(echo "$hf_out" | awk -v f="$f" '$1==f {print $2}')
	ratio=$(awk -v a="$go_tps" -v b="$hf_tps" 'BEGIN { if (b > 0) printf "%.1fx", a/b; else print "-" }')
	printf '%-12s %14.0f %14.0f %8s %10s\n' "$f" "$go_tps" "$hf_tps" "$ratio" "$allocs"
done
