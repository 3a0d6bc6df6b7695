"""flashattn.integrations.transformers on CUDA in bf16: tiny randomly initialised transformers
models (built here, nothing downloaded) on flashattn's kernels against the same models on
transformers' SDPA (eager where SDPA lacks softcapping): logits, a training step's gradients and
greedy generation (KV-cache decode steps), with and without padding.

bf16 results differ from any other bf16 implementation by rounding, so each side is measured
against the same model in float32 (SDPA or eager, on the GPU): ours may be off by at most twice
what SDPA's bf16 is, plus a floor. Greedy generation must pick the same tokens as SDPA's until
a step where the two choices are within bf16 noise of each other on the float32 model (their
float32 logits closer than twice SDPA's bf16 logit error at that step).

Skipped without a GPU and a CUDA build (and where torch or transformers is missing); a head dim
the package was not built with (these use 64 and 128) skips with the library's message."""
import copy

import pytest

torch = pytest.importorskip("torch", reason="needs torch")
transformers = pytest.importorskip("transformers", reason="needs transformers")

import flashattn  # noqa: E402
import flashattn.integrations.transformers as fa_transformers  # noqa: E402
from transformers import (  # noqa: E402
    AttentionInterface,
    Gemma2Config,
    Gemma2ForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    ModernBertConfig,
    ModernBertModel,
)

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and flashattn.built_with_cuda()), reason="needs a GPU and a CUDA build"
)

NAME = fa_transformers.NAME
VOCAB = 512
DEV = "cuda"
FLOOR = 2e-3  # relative error allowed on top of twice SDPA's own in bf16
NEAR_TIE = 0.01  # float32 logit gap, beyond twice SDPA's bf16 error, under which two greedy choices are both right


def llama(head_dim=64, seed=0, **overrides):
    """2 layers, 4 query heads over 2 KV heads."""
    options = dict(vocab_size=VOCAB, hidden_size=4 * head_dim, intermediate_size=8 * head_dim, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                   initializer_range=0.1, pad_token_id=0, bos_token_id=None, eos_token_id=None)  # fmt: skip
    options.update(overrides)
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**options))


def gemma2(seed=0):
    """A 32-key sliding window on every other layer, attention softcapping at 20, head dim 64."""
    torch.manual_seed(seed)
    return Gemma2ForCausalLM(Gemma2Config(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, query_pre_attn_scalar=64, sliding_window=32,
        attn_logit_softcapping=20.0, final_logit_softcapping=30.0, max_position_embeddings=1024,
        initializer_range=0.1, pad_token_id=0, bos_token_id=None, eos_token_id=None))  # fmt: skip


def trio(model, reference="sdpa"):
    """(float32 reference, bf16 on `reference`, bf16 on flashattn), on the GPU, in eval mode."""
    model.set_attn_implementation(reference)
    exact = model.to(DEV).float().eval()
    ref = copy.deepcopy(exact).to(torch.bfloat16)
    ours = copy.deepcopy(ref)
    ours.set_attn_implementation(NAME)
    return exact, ref, ours


@pytest.fixture
def calls(monkeypatch):
    counter = {"n": 0}

    def counted(*args, **kwargs):
        counter["n"] += 1
        try:
            return fa_transformers.attention_forward(*args, **kwargs)
        except NotImplementedError as e:  # no kernel for this head dim / dtype in this build
            pytest.skip(str(e))

    monkeypatch.setitem(AttentionInterface._global_mapping, NAME, counted)
    return counter


def batch(seed, padding, size=(4, 300)):
    """Token ids and a mask; left (generation) or right (training) padding of 0, 37, 5 and 160
    tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, size, generator=g)
    mask = torch.ones_like(ids)
    for row, pad in enumerate([0, 37, 5, 160][: size[0]]):
        if pad and padding == "left":
            mask[row, :pad] = 0
        elif pad and padding == "right":
            mask[row, -pad:] = 0
    return ids.masked_fill(mask == 0, 0).to(DEV), mask.to(DEV)


def rel(x, ref):
    return ((x.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def check(name, ours, ref, exact):
    err, bound = rel(ours, exact), 2 * rel(ref, exact) + FLOOR
    assert err <= bound, f"{name}: error {err:.2e} > {bound:.2e} (twice SDPA's in bf16, plus {FLOOR})"


def check_logits(exact, ref, ours, ids, mask):
    valid = mask.bool()
    with torch.no_grad():
        outs = [m(ids, attention_mask=mask).logits[valid] for m in (exact, ref, ours)]
    check("logits", outs[2], outs[1], outs[0])


def check_gradients(exact, ref, ours, ids, mask):
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, 1:].masked_fill_(mask[:, :-1] == 0, -100)  # no label predicted from a padded position
    for model in (exact, ref, ours):
        model.train()
        model.zero_grad()
        model(ids, attention_mask=mask, labels=labels).loss.backward()
        model.eval()
    params = [dict(m.named_parameters()) for m in (exact, ref, ours)]
    for name, p in params[2].items():
        check(f"grad {name}", p.grad, params[1][name].grad, params[0][name].grad)


def check_generation(exact, ref, ours, ids, mask, new_tokens=24, **options):
    """Greedy decoding: SDPA's and our tokens agree until a step where the float32 model sees the
    two choices within bf16 noise of each other; the logits of rows that agree throughout close."""
    kwargs = dict(attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                  output_logits=True, return_dict_in_generate=True, **options)  # fmt: skip
    a, b = ref.generate(ids, **kwargs), ours.generate(ids, **kwargs)
    start = ids.shape[1]
    for row in range(ids.shape[0]):
        for step in range(new_tokens):
            token_a, token_b = a.sequences[row, start + step], b.sequences[row, start + step]
            if token_a == token_b:
                continue
            # The first difference: our prefix (the same as SDPA's so far) on the float32 model.
            prefix = b.sequences[row : row + 1, : start + step]
            prefix_mask = torch.cat([mask[row : row + 1], mask.new_ones(1, step)], dim=1)
            with torch.no_grad():
                logits = exact(prefix, attention_mask=prefix_mask).logits[0, -1].float()
            gap = (logits[token_a] - logits[token_b]).abs().item()
            noise = (a.logits[step][row].float() - logits).abs().max().item()  # SDPA's bf16 error here
            assert gap <= 2 * noise + NEAR_TIE, (
                f"row {row} step {step}: SDPA's and our tokens differ with a float32 logit gap of {gap:.3f}, "
                f"more than twice SDPA's bf16 logit error {noise:.3f} (+ {NEAR_TIE})")
            break
    same = (a.sequences == b.sequences).all(dim=1)  # rows with the same prefix at every step
    if same.any():
        for step, (la, lb) in enumerate(zip(a.logits, b.logits)):
            assert rel(lb[same], la[same]) < 0.05, f"step {step}: SDPA's and our logits differ"


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("padding", ["none", "left", "right"])
def test_llama_logits_and_gradients(head_dim, padding, calls):
    exact, ref, ours = trio(llama(head_dim))
    ids, mask = batch(1, padding)
    check_logits(exact, ref, ours, ids, mask)
    assert calls["n"] == 2
    check_gradients(exact, ref, ours, ids, mask)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("padding", ["none", "left"])
def test_llama_greedy_generation(padding, cache, calls):
    exact, ref, ours = trio(llama(seed=2))
    ids, mask = batch(3, padding)
    check_generation(exact, ref, ours, ids, mask, cache_implementation=cache)
    assert calls["n"] == 2 * 24


def test_llama_long_cache_decode():
    """Prefill 2000 tokens, then decode: the decode kernels on a longer KV cache."""
    exact, ref, ours = trio(llama(seed=4, max_position_embeddings=4096))
    ids, mask = batch(5, "left", size=(2, 2000))
    check_generation(exact, ref, ours, ids, mask, new_tokens=8)


@pytest.mark.parametrize("padding", ["none", "left"])
def test_gemma2_sliding_window_softcap(padding, calls):
    exact, ref, ours = trio(gemma2(), reference="eager")
    ids, mask = batch(7, padding)
    check_logits(exact, ref, ours, ids, mask)
    assert calls["n"] == 2
    check_gradients(exact, ref, ours, ids, mask)
    check_generation(exact, ref, ours, ids, mask)


def test_modernbert_encoder_padding(calls):
    torch.manual_seed(8)
    config = ModernBertConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                              num_attention_heads=4, local_attention=64, global_attn_every_n_layers=2,
                              max_position_embeddings=1024, initializer_range=0.1, pad_token_id=0,
                              bos_token_id=None, eos_token_id=None, cls_token_id=None, sep_token_id=None)  # fmt: skip
    exact, ref, ours = trio(ModernBertModel(config))
    ids, mask = batch(9, "right")
    valid = mask.bool()
    with torch.no_grad():
        outs = [m(ids, attention_mask=mask).last_hidden_state[valid] for m in (exact, ref, ours)]
    assert calls["n"] == 2
    check("hidden states", outs[2], outs[1], outs[0])
