{
  description = "llmgw-store: a Nix-style content-addressed store for uv-built LLM inference environments";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";

  outputs = { self, nixpkgs }:
    let
      systems = [ "x86_64-linux" "aarch64-linux" ];
      forAll = f: nixpkgs.lib.genAttrs systems (system: f nixpkgs.legacyPackages.${system});
      # pyproject.toml's [project] dependencies, one for one (tests/repo/test_repository.py compares them),
      # but uv: the store runs it as a binary, nixpkgs' on PATH instead of the pinned wheel.
      runtimeDeps = ps: with ps; [ httpx blake3 click packaging zstandard pynacl ];
      # pyproject's `test` extra (moto's server mode needs flask and flask-cors), the uv module the tests
      # ask for the uv binary (python3Packages.uv finds nixpkgs' uv), and pip to install the project.
      testDeps = pkgs: ps: with ps; [
        pytest pytest-xdist boto3 moto flask flask-cors uv pip setuptools mypy
        (toPythonModule pkgs.import-linter)
      ];
    in {
      packages = forAll (pkgs: {
        default = pkgs.python3Packages.buildPythonApplication {
          pname = "llmgw-store";
          version = "0.1.0";
          pyproject = true;
          src = ./.;
          build-system = [ pkgs.python3Packages.setuptools ];
          dependencies = runtimeDeps pkgs.python3Packages;
          # pyproject pins uv==0.13.9 from PyPI; under Nix the store's own pinned uv is installed at
          # first use (or pass --uv), so nixpkgs' uv is only put on PATH, not checked against the pin.
          pythonRemoveDeps = [ "uv" ];
          makeWrapperArgs = [ "--prefix" "PATH" ":" "${pkgs.uv}/bin" ];
          doCheck = false; # the suite starts servers and processes: run it in the devShell
        };
      });

      # `nix develop`, then `python -m pytest` (the README's test command; `-m "not system"` for the
      # quick loop), `lint-imports`, `ruff check .`, `.ci/mypy`. Offline: the project is installed editable, without
      # dependencies, into .venv-nix, a venv that sees the packages below; `llmgw-store` is on PATH.
      # The suite's uv is nixpkgs' (python3Packages.uv), not the pinned 0.13.9: the one test that
      # asserts the pin's version (tests/build/test_build.py) says so.
      devShells = forAll (pkgs: {
        default = pkgs.mkShell {
          packages = [
            (pkgs.python3.withPackages (ps: runtimeDeps ps ++ testDeps pkgs ps))
            pkgs.uv
            pkgs.ruff
            pkgs.nix
          ];
          shellHook = ''
            if [ ! -x .venv-nix/bin/llmgw-store ]; then
              python -m venv --system-site-packages .venv-nix
              .venv-nix/bin/pip install -q --no-deps --no-build-isolation -e .
              # tests/repo/test_architecture.py runs lint-imports from beside the interpreter
              printf '#!%s\nimport sys\nfrom importlinter.cli import lint_imports_command\nsys.exit(lint_imports_command())\n' \
                "$PWD/.venv-nix/bin/python" > .venv-nix/bin/lint-imports
              chmod +x .venv-nix/bin/lint-imports
            fi
            export PATH="$PWD/.venv-nix/bin:$PATH"
          '';
        };
      });
    };
}
