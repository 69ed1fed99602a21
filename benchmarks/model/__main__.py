from benchmarks.model.run import main

main()
