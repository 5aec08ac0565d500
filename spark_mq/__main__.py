from spark_mq.cli import main

main()
