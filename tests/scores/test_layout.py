"""Import direction: ``scorelib.data`` may import ``scorelib.scores``, never the reverse."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_scores_do_not_import_data():
    code = (
        "import sys, scorelib.scores; "
        "print(sorted(m for m in sys.modules if m.startswith('scorelib.data')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout


def test_every_score_source_is_in_scores():
    from scorelib.data.targets import ManyWellTarget, gmm_1d
    from scorelib.processes import EDM
    from scorelib.scores import ManyWellNoisyScore, MixtureScore, ScoreSource

    assert isinstance(ManyWellTarget.create(2).noisy_score(EDM()), ManyWellNoisyScore)
    assert isinstance(gmm_1d().noisy_score(EDM()), MixtureScore)
    assert issubclass(ManyWellNoisyScore, ScoreSource)
    assert ManyWellNoisyScore.__module__.startswith("scorelib.scores.")
