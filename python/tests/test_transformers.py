"""flashattn.integrations.transformers on the CPU backend: tiny randomly initialised transformers
models (built here, nothing downloaded) on flashattn's attention against the same models on
transformers' SDPA (or eager, where SDPA lacks the feature): logits, the gradients of a training
step and greedy generation, with and without padding, plus the KV-cache decode and
continuation steps (dynamic and static caches), packed sequences, GQA, sliding windows,
softcapping, an encoder and an encoder-decoder.

Skipped where torch or transformers is not installed (CI installs neither: see
requirements-test.txt). python/tests/test_transformers_gpu.py runs the same checks on CUDA."""
import copy

import pytest

torch = pytest.importorskip("torch", reason="needs torch (not installed in CI: see requirements-test.txt)")
transformers = pytest.importorskip(
    "transformers", reason="needs transformers (not installed in CI: see requirements-test.txt)"
)

import flashattn.integrations.transformers as fa_transformers  # noqa: E402
from transformers import (  # noqa: E402
    AttentionInterface,
    BartConfig,
    BartForConditionalGeneration,
    Gemma2Config,
    Gemma2ForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    ModernBertConfig,
    ModernBertModel,
)

NAME = fa_transformers.NAME
VOCAB = 97
# float32 on the CPU: both sides differ in summation order only.
TOL = dict(rtol=1e-4, atol=1e-5)


def llama(seed=0, **overrides):
    """2 layers, hidden 64, 4 query heads over 2 KV heads (head dim 16)."""
    options = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                   initializer_range=0.2, pad_token_id=0, bos_token_id=None, eos_token_id=None)  # fmt: skip
    options.update(overrides)
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**options))


def gemma2(seed=0):
    """Sliding window of 4 keys on every other layer, attention softcapping at 5 (tight enough to
    change the scores), GQA 4 over 2 heads."""
    torch.manual_seed(seed)
    config = Gemma2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
                          sliding_window=4, attn_logit_softcapping=5.0, final_logit_softcapping=30.0,
                          max_position_embeddings=256, initializer_range=0.2, pad_token_id=0,
                          bos_token_id=None, eos_token_id=None)  # fmt: skip
    return Gemma2ForCausalLM(config)


def pair(model, reference="sdpa"):
    """(model on `reference`, a copy of it on flashattn), in eval mode."""
    model.set_attn_implementation(reference)
    ours = copy.deepcopy(model)
    ours.set_attn_implementation(NAME)
    assert ours.config._attn_implementation == NAME
    return model.eval(), ours.eval()


@pytest.fixture
def calls(monkeypatch):
    """Counts the calls of flashattn's attention function (so that a test fails if transformers
    quietly took another path)."""
    counter = {"n": 0}

    def counted(*args, **kwargs):
        counter["n"] += 1
        return fa_transformers.attention_forward(*args, **kwargs)

    monkeypatch.setitem(AttentionInterface._global_mapping, NAME, counted)
    return counter


def batch(seed, padding, size=(3, 13)):
    """Token ids and a mask: no padding, left padding (generation) or right padding (training);
    rows padded by different amounts, one row not at all."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, size, generator=g)
    mask = torch.ones_like(ids)
    for row, pad in enumerate([0, 5, 1][: size[0]]):
        if pad and padding == "left":
            mask[row, :pad] = 0
        elif pad and padding == "right":
            mask[row, -pad:] = 0
    return ids.masked_fill(mask == 0, 0), mask


def assert_logits_close(ref, ours, ids, mask, **kwargs):
    with torch.no_grad():
        a = ref(ids, attention_mask=mask, **kwargs).logits
        b = ours(ids, attention_mask=mask, **kwargs).logits
    valid = mask.bool()  # what a padded position outputs is each implementation's own business
    torch.testing.assert_close(b[valid], a[valid], **TOL)


def assert_gradients_close(ref, ours, ids, mask):
    """One training step's loss and the gradients of every parameter. No label is predicted from
    a padded position (with left padding, the last pad would predict the first real token)."""
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, 1:].masked_fill_(mask[:, :-1] == 0, -100)
    losses = []
    for model in (ref, ours):
        model.train()
        model.zero_grad()
        loss = model(ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        losses.append(loss.detach())
        model.eval()
    torch.testing.assert_close(losses[1], losses[0], **TOL)
    ref_grads = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, ref_grads[name].grad, **TOL, msg=lambda m: f"{name}: {m}")


def assert_same_generation(ref, ours, ids, mask, new_tokens=12, **options):
    """Greedy decoding: the same tokens, and per-step logits within tolerance."""
    runs = []
    for model in (ref, ours):
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, output_logits=True, return_dict_in_generate=True, **options)  # fmt: skip
        runs.append(out)
    assert torch.equal(runs[1].sequences, runs[0].sequences), (runs[0].sequences, runs[1].sequences)
    for a, b in zip(runs[0].logits, runs[1].logits):
        torch.testing.assert_close(b, a, **TOL)


# ---- registration ------------------------------------------------------------------------------


def test_registered_under_a_name_transformers_does_not_reserve():
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    assert "flash" not in NAME
    assert ALL_ATTENTION_FUNCTIONS[NAME] is fa_transformers.attention_forward
    assert ALL_MASK_ATTENTION_FUNCTIONS[NAME] is fa_transformers.padding_mask
    with pytest.raises(ValueError, match="flash"):
        fa_transformers.register("my_flash_attention")


# ---- Llama: GQA, causal, padding, KV cache -----------------------------------------------------


@pytest.mark.parametrize("padding", ["none", "left", "right"])
def test_llama_logits(padding, calls):
    ref, ours = pair(llama())
    ids, mask = batch(1, padding)
    assert_logits_close(ref, ours, ids, mask)
    assert calls["n"] == 2  # one call per layer


def test_llama_logits_without_mask(calls):
    ref, ours = pair(llama())
    ids, _ = batch(1, "none")
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, ref(ids).logits, **TOL)
    assert calls["n"] == 2


@pytest.mark.parametrize("padding", ["none", "right", "left"])
def test_llama_training_step_gradients(padding, calls):
    ref, ours = pair(llama(seed=1))
    ids, mask = batch(2, padding)
    assert_gradients_close(ref, ours, ids, mask)
    assert calls["n"] == 2


@pytest.mark.parametrize("padding", ["none", "left"])
def test_llama_greedy_generation(padding, calls):
    ref, ours = pair(llama(seed=2))
    ids, mask = batch(3, padding)
    assert_same_generation(ref, ours, ids, mask)
    assert calls["n"] == 2 * 12  # prefill and 11 decode steps, 2 layers each


@pytest.mark.parametrize("padding", ["none", "left"])
def test_llama_greedy_generation_static_cache(padding, calls):
    """A static cache holds max_length slots; the mask covers the filled ones, the rest are skipped."""
    ref, ours = pair(llama(seed=2))
    ids, mask = batch(3, padding)
    assert_same_generation(ref, ours, ids, mask, cache_implementation="static")
    assert calls["n"] == 2 * 12


@pytest.mark.parametrize("padding", ["none", "left"])
def test_llama_cache_continuation(padding):
    """A prefill into the cache, then several tokens at once against it (seqlen_q < seqlen_k,
    bottom-right causal), then one (the decode step)."""
    ref, ours = pair(llama(seed=3))
    ids, mask = batch(4, padding, size=(3, 16))
    logits = []
    for model in (ref, ours):
        with torch.no_grad():
            cache = transformers.DynamicCache(config=model.config)
            first = model(ids[:, :10], attention_mask=mask[:, :10], past_key_values=cache, use_cache=True)
            second = model(ids[:, 10:15], attention_mask=mask[:, :15], past_key_values=cache, use_cache=True)
            third = model(ids[:, 15:], attention_mask=mask, past_key_values=cache, use_cache=True)
        logits.append(torch.cat([first.logits, second.logits, third.logits], dim=1))
    valid = mask.bool()
    torch.testing.assert_close(logits[1][valid], logits[0][valid], **TOL)


def test_llama_multi_query_and_equal_heads():
    for kv_heads in (1, 4):
        ref, ours = pair(llama(seed=4, num_key_value_heads=kv_heads))
        ids, mask = batch(5, "left")
        assert_logits_close(ref, ours, ids, mask)


@pytest.mark.parametrize("told_by", ["position_ids", "cu_seq_lens"])
def test_llama_packed_sequences(told_by):
    """Padding-free packing: one row holding three sequences, told apart by restarting
    position_ids (transformers' SDPA path turns them into a block-diagonal causal mask), or by
    the offsets that DataCollatorWithFlattening passes as well."""
    ref, ours = pair(llama(seed=5))
    lengths = [5, 7, 4]
    ids = torch.randint(1, VOCAB, (1, sum(lengths)), generator=torch.Generator().manual_seed(6))
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
    offsets = {}
    if told_by == "cu_seq_lens":
        cu = torch.tensor([0, 5, 12, 16], dtype=torch.int32)
        offsets = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=7, max_length_k=7)
    with torch.no_grad():
        a = ref(ids, position_ids=position_ids, use_cache=False).logits
        b = ours(ids, position_ids=position_ids, use_cache=False, **offsets).logits
        # the first sequence alone gives the same logits: nothing leaks across sequences
        alone = ours(ids[:, :5], use_cache=False).logits
    torch.testing.assert_close(b, a, **TOL)
    torch.testing.assert_close(b[:, :5], alone, **TOL)


# ---- Gemma 2: sliding window and softcapping (SDPA has no softcap: against eager) ---------------


@pytest.mark.parametrize("padding", ["none", "left"])
def test_gemma2_sliding_window_softcap(padding, calls):
    ref, ours = pair(gemma2(), reference="eager")
    ids, mask = batch(7, padding)
    assert_logits_close(ref, ours, ids, mask)
    assert calls["n"] == 2
    assert_gradients_close(ref, ours, ids, mask)
    # 12 new tokens after 13: decoding runs well past the 4-key window of the sliding layer.
    assert_same_generation(ref, ours, ids, mask)
    assert_same_generation(ref, ours, ids, mask, cache_implementation="static")  # a rolling window cache


# ---- ModernBERT: non-causal, padding, a symmetric sliding window --------------------------------


@pytest.mark.parametrize("padding", ["none", "right"])
def test_modernbert_encoder(padding, calls):
    torch.manual_seed(8)
    config = ModernBertConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, local_attention=6, global_attn_every_n_layers=2,
                              max_position_embeddings=256, initializer_range=0.2, pad_token_id=0,
                              bos_token_id=None, eos_token_id=None, cls_token_id=None, sep_token_id=None)  # fmt: skip
    ref, ours = pair(ModernBertModel(config))
    ids, mask = batch(9, padding, size=(3, 15))
    with torch.no_grad():
        a = ref(ids, attention_mask=mask).last_hidden_state
        b = ours(ids, attention_mask=mask).last_hidden_state
    assert calls["n"] == 2
    valid = mask.bool()
    torch.testing.assert_close(b[valid], a[valid], **TOL)


# ---- BART: an encoder-decoder, whose cross-attention sees the encoder's padding ------------------


@pytest.mark.parametrize("padding, decoder_length", [("right", 11), ("none", 6)])
def test_bart_encoder_decoder_cross_attention(padding, decoder_length, calls):
    """With padding, decoder length = encoder length, so nothing but the mask's meaning tells the
    padded encoder keys of the cross-attention from padded decoder queries; without, a decoder
    shorter than the encoder."""
    torch.manual_seed(10)
    config = BartConfig(vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                        max_position_embeddings=128, init_std=0.2, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                        decoder_start_token_id=1)  # fmt: skip
    ref, ours = pair(BartForConditionalGeneration(config))
    ids, mask = batch(11, padding, size=(3, 11))
    decoder_ids = torch.randint(3, VOCAB, (3, decoder_length), generator=torch.Generator().manual_seed(12))
    given = mask if padding != "none" else None  # no mask at all: the mask function gets None
    with torch.no_grad():
        a = ref(ids, attention_mask=given, decoder_input_ids=decoder_ids).logits
        b = ours(ids, attention_mask=given, decoder_input_ids=decoder_ids).logits
    assert calls["n"] == 2 + 2 * 2  # encoder self-attention, decoder self- and cross-attention
    torch.testing.assert_close(b, a, **TOL)
    assert_same_generation(ref, ours, ids, mask, new_tokens=8)


# ---- the attention function's edges ------------------------------------------------------------


class _Module(torch.nn.Module):
    is_causal = True


def test_value_head_dim_differs_from_query():
    q, k = torch.randn(2, 4, 9, 24), torch.randn(2, 2, 9, 24)
    v = torch.randn(2, 2, 9, 16)
    out, weights = fa_transformers.attention_forward(_Module(), q, k, v, None, scaling=0.3)
    assert weights is None and out.shape == (2, 9, 4, 16)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.3, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out, expected.transpose(1, 2), **TOL)


def test_unsupported_options_raise():
    q = torch.randn(1, 2, 4, 16)
    with pytest.raises(NotImplementedError, match="dropout"):
        fa_transformers.attention_forward(_Module(), q, q, q, None, dropout=0.1)
    with pytest.raises(NotImplementedError, match="4D"):
        fa_transformers.attention_forward(_Module(), q, q, q, torch.ones(1, 1, 4, 4, dtype=torch.bool))
    with pytest.raises(NotImplementedError, match="sinks"):
        fa_transformers.attention_forward(_Module(), q, q, q, None, s_aux=torch.zeros(2))
