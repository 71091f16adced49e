package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/kvfast/kvfast/benchmarks/demo/demotok"
	"github.com/kvfast/kvfast/internal/jsonscan"
	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/prompt"
)

func init() {
	register("tokenize", "print the token ids a prompt or chat request becomes, as the router routes it", runTokenize)
}

const tokenizeAbout = `Usage: kvfast tokenize --tokenizer URL|DIR|hf:ORG/NAME [--chat] [--model NAME] < input

Reads a prompt from stdin (or, with --chat, a chat-completions request's
JSON body) and prints the token ids the router hashes for it, as one JSON
array, so that they can be compared with what the engine computes when
routing looks wrong.

--tokenizer names what the router would use:
  http://host:port   an engine: its render endpoint (vLLM's
                     /v1/completions/render, /v1/chat/completions/render),
                     else its /tokenize, exactly as --tokenizer MODEL=remote
  DIR, hf:ORG/NAME   the model's tokenizer files (tokenizer.json and
                     tokenizer_config.json): the built-in tokenizer and
                     chat template, exactly as --tokenizer MODEL=DIR
  demo               the embedded demo tokenizer (kvfast mock --tokenizer
                     demo)

With an engine, the model named (--model, or a chat body's "model") must
be one the engine serves.

The prompt is taken byte for byte, a trailing newline included: use
printf '%s' or echo -n to leave it out. Without --chat it is sent as a
completions request {"model": NAME, "prompt": PROMPT}.

Examples:
  printf '%s' 'The capital of France is' | kvfast tokenize --tokenizer http://127.0.0.1:8001
  kvfast tokenize --tokenizer http://127.0.0.1:8001 --chat < request.json
  printf '%s' 'Hello' | kvfast tokenize --tokenizer hf:Qwen/Qwen3-8B
  kvfast tokenize --tokenizer /models/llama3/ --chat < request.json

Exit status: 0 with the ids printed, 1 if they cannot be had, 2 for bad
flags or input.

Flags:
`

func runTokenize(args []string) int {
	return tokenizeCommand(args, os.Stdin, os.Stdout, os.Stderr)
}

// tokenizeCommand is runTokenize with its input and outputs injected.
func tokenizeCommand(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tokenize", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := prompt.DefaultConfig()
	var (
		source = fs.String("tokenizer", "", "the engine's URL (http://host:port), a tokenizer directory, hf:ORG/NAME, or demo (kvfast mock --tokenizer demo's)")
		chat   = fs.Bool("chat", false, "stdin is a chat-completions request body, not a prompt")
		model  = fs.String("model", "", "the served model name, sent with a prompt (a chat body names its own)")
	)
	// A command can wait longer than routing does.
	fs.DurationVar(&cfg.Timeout, "timeout", 10*time.Second, "longest wait for the engine")
	keyFile := fs.String("engine-api-key-file", "", "`file` holding the API key the engine was started with, on its one line, sent as kvfast serve sends it")
	if err := parseFlags(fs, args, tokenizeAbout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 || *source == "" {
		fmt.Fprintln(stderr, "kvfast tokenize: want --tokenizer and no arguments (the input is read from stdin)")
		return 2
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(stderr, "kvfast tokenize:", err)
		return 2
	}
	if *keyFile != "" {
		var err error
		if cfg.EngineToken, err = readToken("engine API key", *keyFile); err != nil {
			fmt.Fprintln(stderr, "kvfast tokenize:", err)
			return 2
		}
	}
	in, err := io.ReadAll(stdin)
	if err != nil {
		fmt.Fprintln(stderr, "kvfast tokenize: cannot read stdin:", err)
		return 1
	}
	api, body := openai.APIChatCompletions, in
	if !*chat {
		api, body = openai.APICompletions, completionRequest(*model, in)
	}
	var p openai.Parser
	var req openai.ParsedRequest
	if err := p.Parse(body, api, &req); err != nil {
		fmt.Fprintln(stderr, "kvfast tokenize: cannot read the request:", err)
		return 2
	}
	if req.Prompt == openai.PromptTokens {
		fmt.Fprintln(stderr, "kvfast tokenize: the request's prompt is token ids already")
		return 2
	}
	name := *model
	if req.Model != nil {
		name = string(req.Model)
	}
	var rd prompt.Renderer
	if *source == demotok.Name {
		rd, err = demotok.Open(name)
	} else {
		rd, err = prompt.Open(name, *source, cfg, 0)
	}
	if err != nil {
		fmt.Fprintln(stderr, "kvfast tokenize:", err)
		return 1
	}
	ids, err := rd.Tokens(context.Background(), nil, api, body, &req)
	if err != nil {
		fmt.Fprintln(stderr, "kvfast tokenize: cannot tokenize:", err)
		// Only an engine that refuses the caller wants the key; a 404 for an
		// unknown model, say, wants another --model.
		var f *prompt.Failure
		if errors.As(err, &f) && (f.Status == http.StatusUnauthorized || f.Status == http.StatusForbidden) && *keyFile == "" {
			fmt.Fprintln(stderr, "kvfast tokenize: an engine started with --api-key wants it: --engine-api-key-file")
		}
		if errors.Is(err, prompt.ErrInvalidRequest) {
			return 2 // the input's fault (a template's raise_exception, say), as the engine would answer 400
		}
		return 1
	}
	out := make([]byte, 0, 8*len(ids)+2)
	out = append(out, '[')
	for i, id := range ids {
		if i > 0 {
			out = append(out, ',')
		}
		out = strconv.AppendUint(out, uint64(id), 10)
	}
	out = append(out, "]\n"...)
	if _, err := stdout.Write(out); err != nil {
		return 1
	}
	return 0
}

// completionRequest is the completions body of a prompt: text with any
// invalid UTF-8 replaced, as JSON carries it.
func completionRequest(model string, text []byte) []byte {
	b := []byte(`{`)
	if model != "" {
		b = append(b, `"model":`...)
		b = jsonscan.AppendQuoted(b, model)
		b = append(b, ',')
	}
	b = append(b, `"prompt":`...)
	b = jsonscan.AppendQuoted(b, string(text))
	return append(b, '}')
}
