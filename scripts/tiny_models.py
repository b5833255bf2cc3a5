"""The tiny random-weight LLaMA-family models of scripts/make-test-models, built in one place so
that its GGUF step and scripts/make-hf-test-models make the same weights (same seed, same code).

  python tiny_models.py gguf-source NAME HF OUT  # the transformers directory the GGUF converter
                                                 # reads (HF) and OUT/reference.json
  python tiny_models.py hf NAME OUT              # OUT/hf: the Hugging Face directory in the
                                                 # dtype/sharding chosen for NAME below, and
                                                 # OUT/hf-reference.json from that directory
Nothing is downloaded: the tokenizer is trained here, the weights are seeded random.
"""
import json, os, random, shutil, sys
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
from transformers import PreTrainedTokenizerFast
import transformers as T

# Longer than the Mistral window (4), so the window cuts keys off.
PROMPT = "hello world the cat sat on the mat with a tiny llama model"
GREEDY_STEPS = 16


def tokenizer(hf):
    """A byte-level BPE trained on a seeded synthetic corpus, saved into `hf`."""
    rng = random.Random(25)
    words = ["the", "cat", "sat", "on", "mat", "model", "block", "quant", "rocm", "forge", "token",
             "hello", "world", "layer", "weight", "scale", "super", "tiny", "llama", "window"]
    corpus = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(2000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<s>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")
    fast.save_pretrained(hf)
    return fast


def build(name, hf):
    """Tokenizer (saved into `hf`), model (not saved), its config and class, for model `name`."""
    env = os.environ
    fast = tokenizer(hf)
    vocab = len(fast)
    # The model's vocabulary padded past the tokenizer's (as released models do): the converter
    # checks every id the tokenizer class it loads knows (it may add special tokens of its own)
    # against it, and the padding rows exercise the loader's unused-token handling.
    model_vocab = max(vocab, max(T.AutoTokenizer.from_pretrained(hf).get_vocab().values()) + 1)
    model_vocab = (model_vocab + 32 + 63) // 64 * 64
    # llama3-kquant: rows of 256 and 512 values, whole K-quant super-blocks.
    hidden = 256 if name == "llama3-kquant" else int(env.get("HIDDEN", "64"))
    common = dict(vocab_size=model_vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
                  bos_token_id=0, eos_token_id=1, torch_dtype="float32")
    if name == "llama3-1b-shape":
        # Llama-3.2-1B's shapes and settings (random weights, this tokenizer): what a user's
        # Q4_K_M download of that model asks of the loader, the K-quant GEMVs and the LM head.
        common.update(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                      num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                      max_position_embeddings=131072, rope_theta=500000.0)
        model_vocab = 128256
        cfg = T.LlamaConfig(**common, head_dim=64, tie_word_embeddings=True,
                            rope_scaling={"rope_type": "llama3", "factor": 32.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 8192})
        cls = T.LlamaForCausalLM
    elif name in ("llama3-tiny", "llama3-kquant"):
        # Llama 3's rope scaling with an original context short enough that every branch of the
        # factor formula (high, smooth, low frequencies) is taken at head size 16.
        cfg = T.LlamaConfig(**common, tie_word_embeddings=False,
                            rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 64})
        cls = T.LlamaForCausalLM
    elif name == "qwen2-tiny":
        cfg = T.Qwen2Config(**common, tie_word_embeddings=True, use_sliding_window=False)
        cls = T.Qwen2ForCausalLM
    elif name == "qwen3-tiny":
        cfg = T.Qwen3Config(**common, head_dim=24, tie_word_embeddings=False,
                            use_sliding_window=False)
        cls = T.Qwen3ForCausalLM
    elif name == "mistral-tiny":
        cfg = T.MistralConfig(**common, sliding_window=4, tie_word_embeddings=False)
        cls = T.MistralForCausalLM
    elif name == "phi3-tiny":
        c = dict(common, num_key_value_heads=4)
        cfg = T.Phi3Config(**c, partial_rotary_factor=0.5, sliding_window=None,
                           tie_word_embeddings=False, pad_token_id=1)
        cls = T.Phi3ForCausalLM
        # The Phi-3 converter reads a GPT-2 tokenizer only when tokenizer_config.json says so.
        p = os.path.join(hf, "tokenizer_config.json")
        tc = json.load(open(p))
        tc["tokenizer_class"] = "GPT2Tokenizer"
        json.dump(tc, open(p, "w"))
    else:
        raise SystemExit(f"no config for {name}")
    torch.manual_seed(25)
    model = cls(cfg).eval()
    # Larger-than-default weights (and biases, norms off 1) so the logits are not all near zero
    # and every difference between the architectures shows in them.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 1.0 / p.shape[1] ** 0.5)
            elif n.endswith("bias"):
                p.normal_(0.0, 0.5)
            else:
                p.uniform_(0.8, 1.2)
    model.config.architectures = [cls.__name__]
    return fast, model, cfg, cls, vocab, model_vocab


def reference(model, fast):
    """The prompt's ids, the f32 logits at its last position, greedy tokens with their leads."""
    ids = fast(PROMPT)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1].tolist()
        seq, leads = list(ids), []
        for _ in range(GREEDY_STEPS):
            last = model(torch.tensor([seq])).logits[0, -1]
            top = torch.topk(last, 2)
            leads.append(float(top.values[0] - top.values[1]))
            seq.append(int(top.indices[0]))
    return {"prompt": PROMPT, "ids": ids, "last_logits": logits, "greedy": seq[len(ids):],
            "greedy_leads": leads}


def gguf_source(name, hf, out):
    fast, model, cfg, cls, vocab, model_vocab = build(name, hf)
    model.save_pretrained(hf, safe_serialization=True)
    ref = reference(model, fast)
    ref.update({"name": name, "architecture": cls.__name__, "vocab_size": model_vocab,
                "tokenizer_size": vocab, "config": json.loads(cfg.to_json_string())})
    json.dump(ref, open(os.path.join(out, "reference.json"), "w"))


# How each model's Hugging Face directory is stored: the dtype of its weights and the largest
# shard (None: one model.safetensors). One bf16, one sharded (with model.safetensors.index.json),
# the rest f32, so every loading path is exercised while the files stay small.
HF_LAYOUT = {
    "llama3-tiny": (torch.float32, None),
    "qwen2-tiny": (torch.bfloat16, None),
    "qwen3-tiny": (torch.float32, None),
    "mistral-tiny": (torch.float32, "100KB"),
    "phi3-tiny": (torch.float32, None),
}


def hf_dir(name, out):
    dtype, shard = HF_LAYOUT[name]
    hf = os.path.join(out, "hf")
    if os.path.exists(hf):
        shutil.rmtree(hf)
    fast, model, cfg, cls, vocab, model_vocab = build(name, hf)
    # generation_config.json and a chat template, as released checkpoints carry them.
    fast.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                          "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}"
                          "<|im_start|>assistant\n{% endif %}")
    fast.save_pretrained(hf)
    if name == "llama3-tiny":
        # Older releases keep the template in tokenizer_config.json (transformers 5 writes
        # chat_template.jinja): one model of each kind, so the loader reads both.
        jinja = os.path.join(hf, "chat_template.jinja")
        tc_path = os.path.join(hf, "tokenizer_config.json")
        tc = json.load(open(tc_path))
        tc["chat_template"] = open(jinja).read()
        json.dump(tc, open(tc_path, "w"), indent=2)
        os.remove(jinja)
    model = model.to(dtype)
    kw = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(hf, safe_serialization=True, **kw)
    # The reference from the directory as saved, read back in f32 (bf16 weights upcast exactly),
    # so it is what a loader of those same bytes must compute.
    back = cls.from_pretrained(hf, dtype=torch.float32).eval()
    ref = reference(back, T.AutoTokenizer.from_pretrained(hf))
    # Whether these are the GGUF files' weights: the same logits as reference.json's (f32 only).
    gguf_ref = os.path.join(out, "reference.json")
    if os.path.exists(gguf_ref):
        want = torch.tensor(json.load(open(gguf_ref))["last_logits"])
        got = torch.tensor(ref["last_logits"])
        ref["rel_l2_to_gguf_reference"] = float((got - want).norm() / want.norm())
    ref.update({"name": name, "architecture": cls.__name__, "dtype": str(dtype).split(".")[-1],
                "sharded": bool(shard), "vocab_size": model_vocab, "tokenizer_size": vocab})
    json.dump(ref, open(os.path.join(out, "hf-reference.json"), "w"))
    print(name, ref["dtype"], "sharded" if shard else "", sorted(os.listdir(hf)),
          "rel_l2_to_gguf_reference", ref.get("rel_l2_to_gguf_reference"))


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "gguf-source":
        gguf_source(*sys.argv[2:5])
    elif mode == "hf":
        hf_dir(*sys.argv[2:4])
    else:
        raise SystemExit(f"unknown mode {mode}: gguf-source or hf")
