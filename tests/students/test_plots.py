"""students/plots.py: the training curves a student's folder carries (curves.png), phases marked."""
import struct

from students.plots import plot_curves


def test_the_curves_are_an_800_by_600_png(tmp_path):
    history = [{"phase": "1 repr", "train_loss": 1.0, "dev_accuracy": 0.5},
               {"phase": "1 repr", "train_loss": 0.5, "dev_accuracy": 0.6},
               {"phase": "2a logits: head+classifier", "train_loss": 0.25, "dev_accuracy": 0.7}]
    path = tmp_path / "curves.png"
    plot_curves(history, str(path))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    assert struct.unpack(">II", data[16:24]) == (800, 600)  # figsize (8, 6) at 100 dpi
