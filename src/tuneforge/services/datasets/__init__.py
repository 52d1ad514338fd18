"""Files and datasets: uploads, the checks every file passes, previews, preparation for a job."""
