#!/usr/bin/env python3
"""Writes a tiny byte-level BPE tokenizer in Hugging Face's tokenizer.json
format, with a ChatML-style chat template, for prompt's tests. Run from
this directory: python3 gen.py. The merges are few and hand-picked; the
point is a real file the tokenizer package loads, not a good vocabulary."""
import json

def bytes_to_unicode():
    # GPT-2's byte-level alphabet: printable bytes map to themselves, the
    # rest to code points from 256 up.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}

alphabet = bytes_to_unicode()
vocab = {alphabet[b]: i for i, b in enumerate(sorted(alphabet))}
merges = []
def merge(a, b):
    merges.append([a, b])
    if a + b not in vocab:
        vocab[a + b] = len(vocab)
sp = alphabet[ord(" ")]
for a, b in [("t", "h"), ("th", "e"), (sp, "the"), ("i", "n"), (sp, "in"), ("e", "r"), (sp, "a"),
             ("o", "u"), ("s", "y"), ("sy", "s"), ("sys", "t"), ("syst", "e"), ("syste", "m"),
             ("u", "s"), ("us", "e"), ("use", "r"), ("a", "s"), ("as", "s"), ("ass", "i"),
             ("assi", "s"), ("assis", "t"), ("assist", "a"), ("assista", "n"), ("assistan", "t"),
             (alphabet[ord("\n")], alphabet[ord("\n")])]:
    merge(a, b)
special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
added = []
for s in special:
    added.append({"id": len(vocab), "content": s, "single_word": False, "lstrip": False,
                  "rstrip": False, "normalized": False, "special": True})
    vocab[s] = len(vocab)
pattern = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
tok = {
    "version": "1.0",
    "truncation": None,
    "padding": None,
    "added_tokens": added,
    "normalizer": None,
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
    "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
    "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
              "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
              "vocab": vocab, "merges": merges},
}
template = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
config = {"bos_token": None, "eos_token": "<|im_end|>", "chat_template": template,
          "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096}
with open("tokenizer.json", "w") as f:
    json.dump(tok, f, ensure_ascii=False, indent=1)
with open("tokenizer_config.json", "w") as f:
    json.dump(config, f, ensure_ascii=False, indent=1)
