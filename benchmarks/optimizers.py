"""Every trainer at its documented defaults against SingleTrainer, on full Fashion-MNIST.

2 workers (2 ensemble members), batch 32, Adam, one epoch, `local[2]`; test accuracy on the
10,000 test images and training wall time, in one run.

    python benchmarks/optimizers.py [--epochs 1] [--limit N]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))


TRAINERS = ("SingleTrainer", "ADAG", "DOWNPOUR", "DynSGD", "Experimental", "AveragingTrainer",
            "AEASGD", "EAMSGD", "EnsembleTrainer")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--limit", type=int, default=None)
    args = parser.parse_args()
    import report

    spark, train, (images, labels) = report.fashion_mnist_setup(limit=args.limit)
    from distkeras import trainers
    from distkeras.tools.experiments import build_mlp, test_accuracy
    rows, single = [], None
    paper_setting = {"class_name": "SGD", "config": {"learning_rate": 0.01}}
    for name in TRAINERS + ("EAMSGD with SGD",):
        optimizer = paper_setting if name == "EAMSGD with SGD" else "adam"
        name = name.split()[0] if optimizer != "adam" else name
        cls = getattr(trainers, name)
        extra = {"num_ensembles": 2} if name == "EnsembleTrainer" else \
            {} if name == "SingleTrainer" else {"num_workers": 2}
        trainer = cls(keras_model=build_mlp(), worker_optimizer=optimizer,
                      loss="categorical_crossentropy", metrics=["accuracy"], batch_size=32,
                      num_epoch=args.epochs, **extra)
        result = trainer.train(train, verbose=0)
        models = result if isinstance(result, list) else [result]
        accuracies = [test_accuracy(model, images, labels) for model in models]
        settings = {key: value for key, value in trainer.get_config().items()
                    if key in ("communication_window", "rho", "learning_rate", "momentum")
                    and value is not None}
        if single is None:
            single = accuracies[0]
        if optimizer != "adam":
            name += " (worker_optimizer SGD, learning rate 0.01: the EASGD paper's setting)"
        rows.append([name, ", ".join(f"{k}={v}" for k, v in settings.items()) or "-",
                     " / ".join(f"{a:.4f}" for a in accuracies),
                     " / ".join(f"{(a - single) * 100:+.2f}" for a in accuracies),
                     f"{trainer.get_training_time():.1f}"])
    body = (f"Fashion-MNIST ({train.count()} training images), {args.epochs} epoch(s), batch 32, "
            "Adam (unless the row says otherwise), 2 workers, each trainer at its defaults; `local[2]`, executors warmed up. "
            "EnsembleTrainer lists each member.\n\n"
            + report.table(["trainer", "defaults", "test accuracy",
                            "points vs SingleTrainer", "wall time (s)"], rows))
    report.write_section("Optimizer family at defaults", body)
    spark.stop()


if __name__ == "__main__":
    main()
