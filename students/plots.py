"""Training curves: train loss and dev accuracy per epoch, phases marked."""
from __future__ import annotations


def plot_curves(history: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    x = list(range(1, len(history) + 1))
    ax_loss.plot(x, [h["train_loss"] for h in history], marker="o")
    ax_loss.set_ylabel("train loss")
    ax_loss.set_yscale("log")
    ax_acc.plot(x, [h["dev_accuracy"] for h in history], marker="o", color="tab:green")
    ax_acc.set_ylabel("dev accuracy")
    ax_acc.set_xlabel("epoch (all phases)")
    prev = None
    for i, h in enumerate(history, start=1):
        if h["phase"] != prev:
            for ax in (ax_loss, ax_acc):
                ax.axvline(i - 0.5, color="grey", linestyle="--", linewidth=0.8)
            # The short name ("2b logits"): the trainable groups are in metrics.json.
            ax_acc.text(i - 0.45, 0.02, h["phase"].split(":")[0], rotation=90, fontsize=7,
                        transform=ax_acc.get_xaxis_transform(), va="bottom")
            prev = h["phase"]
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
