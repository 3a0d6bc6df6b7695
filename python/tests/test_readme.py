"""The README's transformer-block example runs as written (on a GPU with a CUDA build)."""
import pathlib
import re

import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.skipif(not (torch.cuda.is_available() and flashattn.built_with_cuda()), reason="needs a GPU and a CUDA build")
def test_readme_block_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    example = next(b for b in blocks if "class Block" in b)
    scope = {}
    try:
        exec(compile(example, str(README), "exec"), scope)
    except NotImplementedError as e:  # this build has no kernel for the example's head dim
        pytest.skip(str(e))
    x = scope["x"]
    assert x.grad is not None and x.grad.isfinite().all()
    compiled, block = scope["compiled"], scope["block"]
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), block(x), rtol=2e-2, atol=2e-2)
