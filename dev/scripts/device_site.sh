# Sourced by the *_on_device.sh scripts: installs the carried wheels (.whl/, filled here by
# ../shared/tools/device-wheels.sh) into .site/ and puts it and the checkout on PYTHONPATH, for a GPU
# host that has torch, transformers and peft but no hydra, omegaconf, datasets or math-verify.
rm -rf .site  # a warm host keeps the last call's .site, and pip --target half-replaces it
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export PYTHONPATH="$PWD/.site:$PWD" PYTHONUNBUFFERED=1
