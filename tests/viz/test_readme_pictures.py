"""The README's pictures come from a script; it still runs and draws what the README says."""

import importlib.util
import xml.etree.ElementTree as ET
from pathlib import Path



from tests.conftest import needs_dot

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "readme_pictures.py"


@needs_dot
def test_readme_pictures_script(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("readme_pictures", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(tmp_path) == 0
    plan_svg = (tmp_path / "plan.svg").read_text(encoding="utf-8")
    assert "×4 (layers 0..3)" in plan_svg and "experts 0..7" in plan_svg
    ET.fromstring(plan_svg)
    timeline = (tmp_path / "timeline.svg").read_text(encoding="utf-8")
    assert "budget 3.5 MiB" in timeline
    ET.fromstring(timeline)
