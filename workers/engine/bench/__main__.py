from workers.engine.bench.main import run

if __name__ == "__main__":
    run()
