#!/usr/bin/env python3
"""Writes bert_tiny/: a BERT model directory small enough to load, lower and interpret in a
fuzz iteration (hidden 4, 2 heads, 2 layers, vocabulary 24). The config fuzz target loads it
with a mutated config.json; its model.safetensors also seeds the safetensors target. Weights
are a fixed arithmetic pattern, not trained values: only their shapes and dtypes matter here.
Run from tests/data/fuzz/ (python3 make_bert_tiny.py); the outputs are committed."""
import json
import struct

H, HEADS, I, V, P, T, LAYERS = 4, 2, 8, 24, 8, 2, 2

config = {
    "architectures": ["BertModel"],
    "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": H,
    "initializer_range": 0.02,
    "intermediate_size": I,
    "layer_norm_eps": 1e-12,
    "max_position_embeddings": P,
    "model_type": "bert",
    "num_attention_heads": HEADS,
    "num_hidden_layers": LAYERS,
    "pad_token_id": 0,
    "position_embedding_type": "absolute",
    "type_vocab_size": T,
    "vocab_size": V,
}

# Embeddings in f16 and bf16, the rest in f32, so reading the file converts all three.
tensors = [
    ("embeddings.word_embeddings.weight", "F16", [V, H]),
    ("embeddings.position_embeddings.weight", "BF16", [P, H]),
    ("embeddings.token_type_embeddings.weight", "F32", [T, H]),
    ("embeddings.LayerNorm.weight", "F32", [H]),
    ("embeddings.LayerNorm.bias", "F32", [H]),
]
for l in range(LAYERS):
    p = f"encoder.layer.{l}."
    for lin, (o, i) in [
        ("attention.self.query", (H, H)),
        ("attention.self.key", (H, H)),
        ("attention.self.value", (H, H)),
        ("attention.output.dense", (H, H)),
        ("intermediate.dense", (I, H)),
        ("output.dense", (H, I)),
    ]:
        tensors.append((p + lin + ".weight", "F32", [o, i]))
        tensors.append((p + lin + ".bias", "F32", [o]))
    for ln in ["attention.output.LayerNorm", "output.LayerNorm"]:
        tensors.append((p + ln + ".weight", "F32", [H]))
        tensors.append((p + ln + ".bias", "F32", [H]))


def value(k):
    return ((k * 37) % 17 - 8) / 16.0


def encode(dtype, n, salt):
    vals = [value(k + salt) for k in range(n)]
    if dtype == "F32":
        return b"".join(struct.pack("<f", v) for v in vals)
    if dtype == "F16":
        return b"".join(struct.pack("<e", v) for v in vals)
    # bf16: the top half of the f32 (these values are exact in bf16).
    return b"".join(struct.pack("<f", v)[2:] for v in vals)


header, data = {"__metadata__": {"format": "pt"}}, b""
for salt, (name, dtype, shape) in enumerate(tensors):
    n = 1
    for d in shape:
        n *= d
    blob = encode(dtype, n, salt)
    header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(blob)]}
    data += blob
hdr = json.dumps(header, separators=(",", ":")).encode()
hdr += b" " * (-len(hdr) % 8)
with open("bert_tiny/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(hdr)) + hdr + data)

with open("bert_tiny/config.json", "w") as f:
    json.dump(config, f, indent=2)
    f.write("\n")

words = ["the", "a", "fuzz", "##ing", "##er", "hello", "world", "is", "test", "model",
         "input", "byte", "graph", "file", "small", ".", ",", "!", "?"]
vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words)}
assert len(vocab) == V
special = lambda i, t: {"id": i, "content": t, "single_word": False, "lstrip": False,
                        "rstrip": False, "normalized": False, "special": True}
tokenizer = {
    "version": "1.0",
    "truncation": None,
    "padding": None,
    "added_tokens": [special(vocab[t], t) for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]],
    "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                   "strip_accents": None, "lowercase": True},
    "pre_tokenizer": {"type": "BertPreTokenizer"},
    "post_processor": {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                 {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "[SEP]", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}},
                 {"SpecialToken": {"id": "[SEP]", "type_id": 1}}],
        "special_tokens": {t: {"id": t, "ids": [vocab[t]], "tokens": [t]} for t in ["[CLS]", "[SEP]"]},
    },
    "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
    "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
              "max_input_chars_per_word": 100, "vocab": vocab},
}
with open("bert_tiny/tokenizer.json", "w") as f:
    json.dump(tokenizer, f, indent=1)
    f.write("\n")

with open("bert_tiny/modules.json", "w") as f:
    json.dump([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}],
              f, indent=2)
    f.write("\n")
