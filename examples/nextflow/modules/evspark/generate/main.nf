// EVSPARK_GENERATE: continue every record of a FASTA file (or one --shard of it) with EvSpark.
// nf-core module layout: this process, meta.yml, environment.yml and tests/ (nf-test, stub).
//
// Options go through task.ext.args (e.g. "-n 4096 --seed 7 --shard 2/8"), the model folder
// through the second input ([] for the bundled target). Threads follow task.cpus. The log holds
// evspark's timestamped progress lines and its summary line.
process EVSPARK_GENERATE {
    tag "$meta.id"
    label 'process_medium'

    conda "${moduleDir}/environment.yml"
    // built from the repository: docker build -t evspark:0.1.0 . (the workflow's profiles name
    // their image with a withName selector, which outranks this directive)
    container "evspark:0.1.0"

    input:
    tuple val(meta), path(fasta)
    path model

    output:
    tuple val(meta), path("*.cont.fa")  , emit: fasta
    tuple val(meta), path("*.stats.tsv"), emit: stats
    tuple val(meta), path("*.log")      , emit: log
    path "versions.yml"                 , emit: versions

    when:
    task.ext.when == null || task.ext.when

    script:
    def args = task.ext.args ?: ''
    def prefix = task.ext.prefix ?: "${meta.id}"
    def model_arg = model ? "--model ${model}" : ''
    """
    evspark generate ${fasta} ${model_arg} --threads ${task.cpus} ${args} \\
        -o ${prefix}.cont.fa --stats ${prefix}.stats.tsv 2> ${prefix}.log

    cat <<-END_VERSIONS > versions.yml
    "${task.process}":
        evspark: \$(evspark --version | sed 's/^evspark //')
    END_VERSIONS
    """

    stub:
    def prefix = task.ext.prefix ?: "${meta.id}"
    """
    touch ${prefix}.cont.fa ${prefix}.stats.tsv ${prefix}.log

    cat <<-END_VERSIONS > versions.yml
    "${task.process}":
        evspark: \$(evspark --version | sed 's/^evspark //')
    END_VERSIONS
    """
}
