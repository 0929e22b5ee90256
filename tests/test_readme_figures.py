"""The README quotes measured figures only in its generated block, each copied from the file it cites."""
import importlib.util
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("readme_figures", ROOT / "benchmarks" / "readme_figures.py")
figures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(figures)

# a measured figure: a ratio (0.42x), a time (0.42 s, 12 ms, 30 us, 2 min), a count of goals or tests
FIGURE = re.compile(r"\d[\d,.]*(?:-\d[\d,.]*)?(?:x\b| ?(?:s|ms|us|min)\b| of \d+ goals| passed)")
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def _block_and_rest():
    text = (ROOT / "README.md").read_text()
    head, rest = text.split(figures.BEGIN, 1)
    block, tail = rest.split(figures.END, 1)
    return block.strip(), head + tail


def test_block_is_what_the_results_files_give():
    block, _ = _block_and_rest()
    assert block == figures.block().strip(), "README figures are stale: run python benchmarks/readme_figures.py --write"


def test_every_figure_in_the_block_appears_in_the_file_it_cites():
    block, _ = _block_and_rest()
    bullets = [b for b in block.split("\n- ")[1:]]
    assert bullets, "the figures block quotes nothing"
    for bullet in bullets:
        cited = re.findall(r"`(benchmarks/results/[^`]+\.md)`", bullet)
        assert len(cited) == 1, f"a figure line must cite one results file: {bullet[:80]}"
        source = (ROOT / cited[0]).read_text()
        for figure in FIGURE.findall(bullet):
            for number in NUMBER.findall(figure):
                assert re.search(rf"(?<![\d.]){re.escape(number)}(?![\d])", source), (
                    f"{number} (in {figure!r}) is not in {cited[0]}")


def test_no_figure_outside_the_block():
    _, rest = _block_and_rest()
    prose = re.sub(r"```.*?```", "", rest, flags=re.S)        # commands may hold numbers
    quoted = [m for m in FIGURE.findall(prose) if not m.startswith(("3.10", "3.11", "3.12"))]
    assert not quoted, f"README quotes figures outside the generated block: {quoted}"
